"""``/v1/blobs``: content-addressed bytes, shared by every namespace.

A blob is hashed on read until its file is verified, and again whenever the file's
stamp changes (verified.py): a blob up to ``_VERIFY_FIRST`` is hashed before the
response starts (a mismatch is a clean 404); a larger one is hashed as it streams and
its last chunk is held back until the digest matches, so a corrupted blob never
completes a response. Either way the blob is quarantined and the next upload heals it.
A verified, unchanged file is sent unhashed, its last chunk held back until its stamp
is checked once more. What no stamp shows (a disk's rot) the scrub finds, or a client,
which verifies every download and reports a mismatch (``POST .../mismatch``, scrub.py).

With ``accel_redirect_prefix`` set and the filesystem store, a GET that nginx marks
(``X-Neffcache-Accel``) is answered with headers only and ``X-Accel-Redirect`` naming
the blob's file, which nginx sends from the same volume (deploy/nginx/): at once for a
verified, unchanged file; after hashing it in full, off the event loop, for any other,
so a corrupted blob is quarantined and a ``404``, never handed to nginx. A range too:
nginx cuts it from the file.

With ``blob_redirect_seconds`` set and a store that can presign (S3), a whole-blob GET
of at least ``blob_redirect_min_bytes`` is answered with a ``307`` to a presigned URL
once the blob is known to exist: its bytes never pass through the server, which
therefore cannot verify them; the client does (docs/protocol.md). A range is never
redirected: only the server, which hashes the whole blob first, can verify one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import blake3
from fastapi import APIRouter, Header, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    HEX,
    TOKEN,
    array,
    errors,
    json_answer,
    no_body,
    obj,
    request_body,
)
from neffcache.server.api.body import body_chunks, read_body
from neffcache.server.auth import Caller
from neffcache.server.blobs import BlobStore
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import (
    FULL_ERRNOS,
    BadRequest,
    NotFound,
    RangeNotSatisfiable,
    StoreError,
    StoreFull,
    TooLarge,
)
from neffcache.server.manifest import HEX64
from neffcache.server.scrub import Verdict, quarantine, verify

router = APIRouter()
log = logging.getLogger("neffcache.server")

Digest = Annotated[str, PathParam(pattern=f"^{HEX64}$")]
_VERIFY_FIRST = 16 * 2**20
_MISSING_MAX = 10_000
_MISSING_BODY_MAX = _MISSING_MAX * 80
# Set by the nginx in front (deploy/nginx/): only its requests may be answered with
# X-Accel-Redirect, so a client that reaches the server directly still gets bytes.
ACCEL_HEADER = "x-neffcache-accel"


class CorruptBlob(Exception):
    """A stored blob's bytes do not hash to its digest."""


class Redirect(Response):
    """``307`` to a presigned URL of the blob; ``size`` is the blob's, for the metrics."""

    def __init__(self, url: str, size: int) -> None:
        # no-store: the URL expires, and a cached redirect would outlive it.
        super().__init__(status_code=307, headers={"Location": url, "Cache-Control": "no-store"})
        self.size = size


class Accel(Response):
    """Headers only, ``X-Accel-Redirect: location``: nginx sends the blob's file with
    these headers (deploy/nginx/ keeps the ETag) and its own length and ranges.
    ``size`` is the blob's, for the metrics."""

    def __init__(self, location: str, digest: str, size: int) -> None:
        headers = _headers(digest, size)
        del headers["Content-Length"]  # this answer's body is empty; nginx's is the file
        headers["X-Accel-Redirect"] = location
        super().__init__(headers=headers, media_type="application/octet-stream")
        self.size = size


_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.put(
    "/v1/blobs/{digest}",
    status_code=201,
    response_class=Response,
    openapi_extra={"requestBody": {"required": True, "content": _BYTES}},
    responses={
        **no_body(201, "stored"),
        **no_body(200, "already there"),
        **errors(
            *TOKEN,
            408,
            413,
            507,
            e400="no Content-Length, or the body's length or BLAKE3 is not the one announced",
            e413="over max_blob_bytes",
        ),
    },
)
async def put_blob(
    digest: Digest,
    request: Request,
    caller: CallerDep,
    backends: BackendsDep,
    content_length: Annotated[int | None, Header()] = None,
) -> Response:
    caller.require("write")
    if content_length is None:
        raise BadRequest("Content-Length is required")
    if content_length > backends.settings.max_blob_bytes:
        raise TooLarge(f"{content_length} bytes is over max_blob_bytes")
    staged = _staging_file(backends.blobs.staging_dir())
    try:
        received, actual = await _receive(request, staged, content_length)
        if received != content_length:
            raise BadRequest(f"received {received} bytes, Content-Length said {content_length}")
        if actual != digest:
            raise BadRequest(f"the body hashes to {actual}, not {digest}")
        created = await run_in_threadpool(backends.blobs.commit, staged, digest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
    return Response(status_code=201 if created else 200)


def _staging_file(directory: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix="upload-", dir=directory)
    os.close(fd)
    return Path(name)


_WRITE_BATCH = 2**20


async def _receive(request: Request, staged: Path, limit: int) -> tuple[int, str]:
    """Stream the body to ``staged``; return its length and BLAKE3.

    Hashing and writing happen in a worker thread, 1 MiB at a time, so a large upload
    never stalls the event loop (and the other requests on it), and each upload holds
    about 2 MiB of memory."""
    hasher = blake3.blake3()
    received = 0
    batch = bytearray()
    try:
        with open(staged, "wb") as out:
            async for chunk in body_chunks(request):
                received += len(chunk)
                if received > limit:
                    raise BadRequest(f"the body is longer than Content-Length ({limit})")
                batch += chunk
                if len(batch) >= _WRITE_BATCH:
                    full, batch = batch, bytearray()  # hand it over, no copy
                    await run_in_threadpool(_absorb, hasher, out, full)
            await run_in_threadpool(_absorb, hasher, out, batch)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise StoreFull("the blob store is out of space") from exc
        raise
    return received, hasher.hexdigest()


def _absorb(hasher: Any, out: BinaryIO, data: bytearray) -> None:
    hasher.update(data)
    out.write(data)


@router.head(
    "/v1/blobs/{digest}",
    response_class=Response,
    responses={**no_body(200, "the blob is here"), **errors(*TOKEN, 404, e404="no such blob")},
)
async def head_blob(digest: Digest, caller: CallerDep, backends: BackendsDep) -> Response:
    caller.require("read")
    size = await backends.run(backends.blobs.size, digest)
    if size is None:
        raise NotFound(f"no blob {digest}")
    return Response(headers=_headers(digest, size))


@router.get(
    "/v1/blobs/{digest}",
    response_class=Response,
    responses={
        200: {"description": "the blob's bytes", "content": _BYTES},
        206: {"description": "the range asked for", "content": _BYTES},
        307: {"description": "the blob is at the presigned URL in Location (S3, when enabled)"},
        **errors(*TOKEN, 404, 416, e404="no such blob (or a corrupted one, now quarantined)"),
    },
)
async def get_blob(
    digest: Digest,
    caller: CallerDep,
    backends: BackendsDep,
    range_header: Annotated[str | None, Header(alias="range")] = None,
    accel: Annotated[
        str | None,
        Header(alias=ACCEL_HEADER, description="set by nginx in front (accel_redirect_prefix)"),
    ] = None,
) -> Response:
    return await answer_blob(backends, caller, digest, range_header, accel is not None)


async def answer_blob(
    backends: Backends,
    caller: Caller,
    digest: str,
    range_header: str | None,
    accel: bool = False,
) -> Response:
    """``GET /v1/blobs/{digest}`` for a validated digest (the route and the fast path);
    ``accel``: the request came through nginx, which can send the file itself."""
    caller.require("read")
    # A range hashes the whole blob first: too long for the event loop, whatever the store.
    run = run_in_threadpool if range_header else backends.run
    metrics = backends.metrics
    try:
        response = await _accel_response(backends, digest) if accel else None
        if response is None:
            response = await run(_blob_response, backends, digest, range_header)
    except NotFound:
        metrics.blob_reads.labels("miss").inc()
        raise
    metrics.blob_reads.labels("hit").inc()
    if isinstance(response, Redirect):
        metrics.blob_redirects.inc()
        metrics.blob_bytes_redirected.inc(response.size)
    elif isinstance(response, Accel):
        metrics.blob_accel.inc()
        metrics.blob_bytes_accel.inc(response.size)
    else:
        metrics.blob_bytes_served.inc(int(response.headers.get("content-length", 0)))
    return response


def _blob_response(backends: Backends, digest: str, range_header: str | None) -> Response:
    blobs = backends.blobs
    memo = backends.verified
    seen_at = time.time()
    stamped = blobs.stamp(digest)
    size = blobs.size(digest)
    if size is None:
        raise NotFound(f"no blob {digest}")
    # The evictor leaves a blob in use alone. Only one that exists is remembered: a
    # GET of absent digests must cost no memory.
    backends.blob_use.touch((digest,))
    span = _parse_range(range_header, size)
    if span is None:
        redirect = _redirect(backends, digest, size)
        if redirect is not None:
            return redirect
    stamp, changed_at = stamped if stamped is not None else (None, None)
    if memo.trusted(digest, stamp):

        def unchanged(chunks: Iterator[bytes]) -> bool:
            read = getattr(chunks, "unchanged_since", None)
            if read is not None:
                # The store can tell about the very file that was read (fs.py): one
                # collected, or collected and uploaded again, while it was read still
                # holds the verified bytes, and a download is not cut off.
                return bool(read(stamp))
            now = blobs.stamp(digest)
            if now is None:
                # Removed while it was read. Collected: the read holds the file it
                # opened, whose bytes were verified, and a download is not cut off.
                # Quarantined (found corrupt by another read): the memo forgot it.
                return memo.trusted(digest, stamp)
            return now[0] == stamp

        trusted = _trusted_response(backends, digest, size, span, unchanged)
        if trusted is not None:
            return trusted
        memo.forget(digest)  # changed while it was read: hash it, as any other
    try:
        if span is not None or size <= _VERIFY_FIRST:
            response = _verified_response(blobs, digest, size, span)
            memo.remember(digest, stamp, changed_at, seen_at)
            return response
    except CorruptBlob:
        quarantine(blobs, memo, backends.metrics, digest, "read")
        raise NotFound(f"no blob {digest}") from None
    chunks = blobs.read(digest)
    if chunks is None:
        raise NotFound(f"no blob {digest}")

    def corrupt() -> None:
        quarantine(blobs, memo, backends.metrics, digest, "read")

    def verified() -> None:
        memo.remember(digest, stamp, changed_at, seen_at)

    checked = backends.blob_use.streaming(digest, _held_back(chunks, digest, corrupt, verified))
    return StreamingResponse(
        # A plain iterator makes Starlette move every step to the thread pool: right
        # for a remote store, a needless hop for a local file in the page cache.
        _async(checked) if backends.inline else checked,
        headers=_headers(digest, size),
        media_type="application/octet-stream",
    )


async def _accel_response(backends: Backends, digest: str) -> Response | None:
    """``X-Accel-Redirect`` to the blob's file when ``accel_redirect_prefix`` is set and
    the store has files; None to serve the blob here. A file not verified since it last
    changed is hashed first, in a worker thread; corrupt, it is quarantined (404)."""
    prefix = backends.settings.accel_redirect_prefix
    root = getattr(backends.blobs, "root", None)
    if prefix is None or not isinstance(root, Path):
        return None
    found = await backends.run(_accel_if_trusted, backends, digest, prefix, root)
    if found is not None:
        return found
    return await run_in_threadpool(_accel_once_verified, backends, digest, prefix, root)


def _accel_if_trusted(backends: Backends, digest: str, prefix: str, root: Path) -> Accel | None:
    blobs = backends.blobs
    stamped = blobs.stamp(digest)
    size = blobs.size(digest)
    if size is None:
        raise NotFound(f"no blob {digest}")
    backends.blob_use.touch((digest,))  # as any read: the evictor leaves it alone
    if stamped is None or not backends.verified.trusted(digest, stamped[0]):
        return None
    return _accel(blobs, digest, size, prefix, root)


def _accel_once_verified(
    backends: Backends, digest: str, prefix: str, root: Path
) -> Response | None:
    verdict = verify(backends.blobs, backends.verified, backends.metrics, digest, "read")
    if verdict is Verdict.CHANGED:
        return None  # it changed while it was hashed: the ordinary path hashes it again
    size = backends.blobs.size(digest)
    if verdict is not Verdict.SOUND or size is None:
        raise NotFound(f"no blob {digest}")
    return _accel(backends.blobs, digest, size, prefix, root)


def _accel(blobs: BlobStore, digest: str, size: int, prefix: str, root: Path) -> Accel:
    path = blobs.local_path(digest)
    if path is None:
        raise NotFound(f"no blob {digest}")
    return Accel(f"{prefix}/{path.relative_to(root).as_posix()}", digest, size)


def _redirect(backends: Backends, digest: str, size: int) -> Redirect | None:
    """A redirect to a presigned URL of a blob known to exist, when the settings ask
    for one and the store can presign; None to serve it here. A store that fails to
    sign (no credentials to sign with) is logged and the blob served here: a redirect
    is an optimisation, never a reason for a download to fail."""
    settings = backends.settings
    presign = getattr(backends.blobs, "presign", None)
    if not settings.blob_redirect_seconds or presign is None:
        return None
    if size < settings.blob_redirect_min_bytes:
        return None
    try:
        url = presign(digest, settings.blob_redirect_seconds)
    except StoreError as exc:
        log.warning("cannot presign blob %s (%s); serving it", digest, exc)
        return None
    return Redirect(str(url), size)


def _verified_response(
    blobs: BlobStore, digest: str, size: int, span: tuple[int, int] | None
) -> Response:
    """A whole small blob, or a range of any blob, hashed in full before it is sent."""
    # A whole small blob in one read (fs.py), as it is sent; a large one in chunks.
    chunks = blobs.read(digest, 0, size if span is None else None)
    if chunks is None:
        raise NotFound(f"no blob {digest}")
    if span is None:
        data = b"".join(chunks)
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != digest:
            raise CorruptBlob(digest)
        return Response(data, headers=_headers(digest, size), media_type="application/octet-stream")
    # A range of a large blob: hash the whole blob as a stream (never all in memory),
    # then send the range from the store.
    hasher = blake3.blake3()
    for chunk in chunks:
        hasher.update(chunk)
    if hasher.hexdigest() != digest:
        raise CorruptBlob(digest)
    start, end = span
    part = blobs.read(digest, start, end)
    if part is None:
        raise NotFound(f"no blob {digest}")
    headers = _headers(digest, end - start)
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return StreamingResponse(
        part, status_code=206, headers=headers, media_type="application/octet-stream"
    )


def _trusted_response(
    backends: Backends,
    digest: str,
    size: int,
    span: tuple[int, int] | None,
    unchanged: Callable[[Iterator[bytes]], bool],
) -> Response | None:
    """A blob whose file was verified and had not changed since (verified.py), sent
    unhashed; None when its file changed while it was read. The stamp is checked again
    after the last byte is read and before it is sent (the last chunk is held back),
    so a write that lands during the read breaks the response off."""
    start, end = span if span is not None else (0, size)
    chunks = backends.blobs.read(digest, start, end)
    if chunks is None:
        raise NotFound(f"no blob {digest}")
    headers = _headers(digest, end - start)
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if span is None and size <= _VERIFY_FIRST:
        body = b"".join(chunks)  # small: one write, as a verified small blob is sent
        if not unchanged(chunks):
            return None
        return Response(body, headers=headers, media_type="application/octet-stream")

    def still_verified() -> bool:
        if unchanged(chunks):
            return True
        backends.verified.forget(digest)
        log.error("blob %s changed while it was served; the response was cut off", digest)
        return False

    checked = backends.blob_use.streaming(digest, _hold_last(chunks, digest, still_verified))
    return StreamingResponse(
        # As for a verified stream: no thread-pool hop per chunk of a local file.
        _async(checked) if backends.inline else checked,
        status_code=206 if span is not None else 200,
        headers=headers,
        media_type="application/octet-stream",
    )


def _held_back(
    chunks: Iterator[bytes],
    digest: str,
    on_corrupt: Callable[[], None],
    on_verified: Callable[[], None] = lambda: None,
) -> Iterator[bytes]:
    """The chunks, hashed as they stream, the last held back until the digest matches."""
    hasher = blake3.blake3()

    def sound() -> bool:
        if hasher.hexdigest() != digest:
            on_corrupt()  # quarantined; the stream breaks off before its last chunk
            return False
        on_verified()
        return True

    return _hold_last(chunks, digest, sound, hasher.update)


def _hold_last(
    chunks: Iterator[bytes],
    digest: str,
    sound: Callable[[], bool],
    see: Callable[[bytes], object] = lambda chunk: None,
) -> Iterator[bytes]:
    """The chunks (each shown to ``see`` first), the last held back until ``sound()``
    says the whole is right; otherwise the stream breaks off before it completes."""
    pending: bytes | None = None
    for chunk in chunks:
        if pending is not None:
            yield pending
        see(chunk)
        pending = chunk
    if not sound():
        raise CorruptBlob(digest)
    if pending is not None:
        yield pending


async def _async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _headers(digest: str, length: int) -> dict[str, str]:
    return {
        "Content-Length": str(length),
        "ETag": f'"{digest}"',
        "Accept-Ranges": "bytes",
        "Cache-Control": "public, max-age=31536000, immutable",
    }


_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")  # at most int64 digits


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """A single ``bytes=a-b`` range as [start, end), or None for the whole blob."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None or not (match[1] or match[2]):
        raise RangeNotSatisfiable(f"unsupported Range {header!r}; use one bytes=a-b range")
    if match[1]:
        start = int(match[1])
        end = min(int(match[2]) + 1, size) if match[2] else size
    else:  # a suffix: the last N bytes
        start, end = max(size - int(match[2]), 0), size
    if start >= size or start >= end:
        raise RangeNotSatisfiable(f"range {header!r} is outside the blob's {size} bytes")
    return start, end


_RECHECK = obj({"recheck": {"type": "string", "enum": ["queued", "recent", "busy"]}})


@router.post(
    "/v1/blobs/{digest}/mismatch",
    status_code=202,
    responses={
        **json_answer(
            202,
            _RECHECK,
            "queued for a re-verification; recent (one was queued lately) or busy "
            "(too many are): nothing more done",
        ),
        **errors(*TOKEN, 404, e404="no such blob (or quarantined already)"),
    },
)
async def report_mismatch(
    digest: Digest, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, str]:
    """A client downloaded bytes that do not hash to ``digest``: the server forgets it
    verified the blob and hashes it again in the background (scrub.py ``Rechecks``)."""
    caller.require("read")
    reports = backends.metrics.mismatch_reports
    if await backends.run(backends.blobs.size, digest) is None:
        reports.labels("absent").inc()
        raise NotFound(f"no blob {digest}")
    result: str = request.app.state.integrity.rechecks.report(digest)
    reports.labels(result).inc()
    if result == "queued":
        log.warning("a client found blob %s did not match its digest; verifying it", digest)
    return {"recheck": result}


class MissingRequest(BaseModel):
    digests: list[str] = Field(max_length=_MISSING_MAX)


@router.post(
    "/v1/blobs/missing",
    openapi_extra=request_body(MissingRequest),
    responses={
        **json_answer(200, obj({"missing": array(HEX)}), "the digests the server lacks"),
        **errors(*TOKEN, *BODY),
    },
)
async def missing_blobs(
    request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, list[str]]:
    caller.require("read")
    try:
        body = MissingRequest.model_validate_json(await read_body(request, _MISSING_BODY_MAX))
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {exc.errors()[0]['msg']}") from None
    for digest in body.digests:
        if not re.fullmatch(HEX64, digest):
            raise BadRequest(f"{digest!r} is not a 64-hex digest")
    # Asking renews nothing: an upload no entry references lives out its grace from
    # its upload, however often anyone asks about it (else a write token could keep
    # unpublished bytes forever, outside every quota). A publisher that loses that race
    # is told which blobs its manifest misses, and uploads them (api/entries.py).
    missing = await backends.run(_missing, backends.blobs, body.digests)
    return {"missing": missing}


def _missing(blobs: BlobStore, digests: list[str]) -> list[str]:
    return [d for d in dict.fromkeys(digests) if blobs.size(d) is None]
