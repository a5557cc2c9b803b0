"""Request bodies, from an async iterator of byte chunks (the HTTP layer's adapter
reads the request: api/body.py), with no HTTP in them.

A blob's upload (``receive_blob``) streams to a new file beside the blobs, hashed as
it arrives, and is committed under its digest only once its length and BLAKE3 are the
ones announced; whatever happens, the staging file is gone afterwards. A small body
(``read_capped``: manifests, requests, reports) is read whole, never past its limit.
A refusal is one of ``errors.py``'s exceptions: ``BadRequest`` (no length announced,
a body of another length or digest), ``TooLarge`` (over a limit), ``StoreFull``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import blake3

from neffcache.server.errors import FULL_ERRNOS, BadRequest, StoreFull, TooLarge
from neffcache.server.services import Services, in_thread

# Hashed and written a batch at a time, in a worker thread: about 2 MiB per upload.
_WRITE_BATCH = 2**20


@dataclass(frozen=True)
class Upload:
    """A received upload: the digest and length announced, and what arrived."""

    digest: str
    announced: int  # Content-Length
    received: int
    actual: str  # the BLAKE3 of the bytes received


async def receive_blob(
    services: Services, digest: str, content_length: int | None, body: AsyncIterator[bytes]
) -> bool:
    """Store the blob ``body`` brings under ``digest``: True when it is new, False when
    it was there already. Its length is checked against the limit before a byte is
    read, and its bytes against ``content_length`` and ``digest`` before it is kept."""
    announced = check_announced(services, content_length)
    staged = staging_file(services)
    try:
        received, actual = await _receive(body, staged, announced)
        upload = Upload(digest, announced, received, actual)
        return await in_thread(store, services, staged, upload)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()


def check_announced(services: Services, content_length: int | None) -> int:
    """The length an upload announces, if the server takes blobs that large."""
    if content_length is None:
        raise BadRequest("Content-Length is required")
    if content_length > services.settings.max_blob_bytes:
        raise TooLarge(f"{content_length} bytes is over max_blob_bytes")
    return content_length


def staging_file(services: Services) -> Path:
    """A new empty file beside the blobs, for an upload to stream into."""
    fd, name = tempfile.mkstemp(prefix="upload-", dir=services.blobs.staging_dir())
    os.close(fd)
    return Path(name)


async def _receive(body: AsyncIterator[bytes], staged: Path, limit: int) -> tuple[int, str]:
    """Stream the body to ``staged``; return its length and BLAKE3.

    Hashing and writing happen in a worker thread, 1 MiB at a time, so a large upload
    never stalls the event loop (and the other requests on it), and each upload holds
    about 2 MiB of memory."""
    hasher = blake3.blake3()
    received = 0
    batch = bytearray()
    try:
        with open(staged, "wb") as out:
            async for chunk in body:
                received += len(chunk)
                if received > limit:
                    raise BadRequest(f"the body is longer than Content-Length ({limit})")
                batch += chunk
                if len(batch) >= _WRITE_BATCH:
                    full, batch = batch, bytearray()  # hand it over, no copy
                    await in_thread(_absorb, hasher, out, full)
            await in_thread(_absorb, hasher, out, batch)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise StoreFull("the blob store is out of space") from exc
        raise
    return received, hasher.hexdigest()


def _absorb(hasher: Any, out: BinaryIO, data: bytearray) -> None:
    hasher.update(data)
    out.write(data)


def store(services: Services, staged: Path, upload: Upload) -> bool:
    """Commit a staged upload under its digest once it is the blob announced (else
    BadRequest); True when it is new, False when the blob was there already."""
    if upload.received != upload.announced:
        raise BadRequest(
            f"received {upload.received} bytes, Content-Length said {upload.announced}"
        )
    if upload.actual != upload.digest:
        raise BadRequest(f"the body hashes to {upload.actual}, not {upload.digest}")
    return services.blobs.commit(staged, upload.digest)


async def read_capped(body: AsyncIterator[bytes], content_length: str | None, limit: int) -> bytes:
    """A small body whole: TooLarge over ``limit`` bytes, whether its
    ``content_length`` (the header as sent; BadRequest unless a number) says so before
    a byte is read or its bytes run past it."""
    if content_length is not None:
        if not content_length.isdigit() or len(content_length) > 19:
            raise BadRequest("Content-Length is not a number")
        if int(content_length) > limit:
            raise TooLarge(f"this body may be at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"this body may be at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
