"""Blob reads, verified against their digest: what to send for ``GET /v1/blobs/{digest}``
(api/blobs.py turns it into a response; the policy is that module's docstring).

A blob is hashed on read until its file is verified, and again whenever the file's
stamp changes (verified.py): up to ``VERIFY_FIRST`` bytes before anything is sent (a
mismatch quarantines it, and the read is a miss); a larger one as it streams, its
last chunk held back until the digest matches. A verified, unchanged file is sent
unhashed, its last chunk held back until its stamp is checked once more; a server
that sends files itself (``open_verified``: with ``sendfile``) does the same with its
last bytes.

Each function blocks on the store; a miss (no such blob, or a corrupt one, now
quarantined) is None, a bad range ``RangeNotSatisfiable``. Uploads are
services/uploads.py.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import blake3

from neffcache.server.blobs import BlobStore
from neffcache.server.errors import RangeNotSatisfiable, StoreError
from neffcache.server.scrub import Verdict, quarantine, verify
from neffcache.server.services import Services

if TYPE_CHECKING:
    from neffcache.server.blobs.fs import OpenBlob

log = logging.getLogger("neffcache.server")

VERIFY_FIRST = 16 * 2**20


class CorruptBlob(Exception):
    """A stored blob's bytes do not hash to its digest."""


@dataclass(frozen=True)
class Whole:
    """A whole blob's bytes, verified (or from a verified, unchanged file)."""

    data: bytes


@dataclass(frozen=True)
class Chunks:
    """Bytes ``start`` to ``end`` of a blob of ``size``, as they are read; the stream
    breaks off before its last chunk if the blob proves corrupt or changed.
    ``blocking``: each chunk is a blocking read (a worker thread per step), else the
    store is local and the chunks may be read on the event loop."""

    chunks: Iterator[bytes]
    start: int
    end: int
    size: int
    blocking: bool

    @property
    def partial(self) -> bool:
        return (self.start, self.end) != (0, self.size)


@dataclass(frozen=True)
class Presigned:
    """The blob is at ``url`` (a presigned URL of the store); ``size`` its length."""

    url: str
    size: int


@dataclass(frozen=True)
class File:
    """The blob's verified file, at ``location`` under the accel prefix (nginx sends it)."""

    location: str
    size: int


Read = Whole | Chunks | Presigned


def read(services: Services, digest: str, range_header: str | None) -> Read | None:
    """What to send for a blob (a ``Range`` header's one range of it, if given)."""
    blobs = services.blobs
    memo = services.verified
    seen_at = time.time()
    stamped = blobs.stamp(digest)
    size = blobs.size(digest)
    if size is None:
        return None
    # The evictor leaves a blob in use alone. Only one that exists is remembered: a
    # GET of absent digests must cost no memory.
    services.blob_use.touch((digest,))
    span = parse_range(range_header, size)
    if span is None:
        redirect = _presigned(services, digest, size)
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

        trusted = _trusted(services, digest, size, span, unchanged)
        if trusted != "changed":
            return trusted
        memo.forget(digest)  # changed while it was read: hash it, as any other
    try:
        if span is not None or size <= VERIFY_FIRST:
            found = _verified(blobs, digest, size, span)
            if found is not None:
                memo.remember(digest, stamp, changed_at, seen_at)
            return found
    except CorruptBlob:
        quarantine(blobs, memo, services.metrics, digest, "read")
        return None
    chunks = blobs.read(digest)
    if chunks is None:
        return None

    def corrupt() -> None:
        quarantine(blobs, memo, services.metrics, digest, "read")

    def verified() -> None:
        memo.remember(digest, stamp, changed_at, seen_at)

    checked = services.blob_use.streaming(digest, _held_back(chunks, digest, corrupt, verified))
    return Chunks(checked, 0, size, size, blocking=not services.inline)


@dataclass(frozen=True)
class Opened:
    """A verified blob's file, open (``OpenBlob``), and how to tell it has not changed
    since it was verified: ``unchanged()`` after its last byte is read, before it is
    sent; ``changed()`` when it had and the answer is cut off (forgotten as verified,
    and logged), ``forget()`` when it had before anything was sent. ``touch()`` as it is
    sent: the blob is in use, and the evictor leaves it alone."""

    file: OpenBlob
    unchanged: Callable[[], bool]
    changed: Callable[[], None]
    forget: Callable[[], None]  # changed before anything was sent: hashed on the next read
    touch: Callable[[], None]


def open_verified(services: Services, digest: str) -> Opened | None:
    """The blob's file, open, for a server that sends it itself, when the store has
    files and the file was verified and has not changed since; None otherwise, and a
    read (``read``) then says what to send."""
    blobs = services.blobs
    opener: Callable[[str], OpenBlob | None] | None = getattr(blobs, "open_file", None)
    if opener is None:
        return None
    stamped = blobs.stamp(digest)
    if stamped is None or not services.verified.trusted(digest, stamped[0]):
        return None
    opened = opener(digest)
    if opened is None:
        return None
    stamp = stamped[0]
    if not opened.unchanged_since(stamp):
        opened.close()  # another file than the one verified
        return None

    def touch() -> None:
        services.blob_use.touch((digest,))

    def unchanged() -> bool:
        return opened.unchanged_since(stamp)

    def forget() -> None:
        services.verified.forget(digest)

    touch()  # as any read
    return Opened(opened, unchanged, lambda: _cut_off(services, digest), forget, touch)


def _cut_off(services: Services, digest: str) -> None:
    """A verified blob's file changed while it was sent: hashed again on its next read."""
    services.verified.forget(digest)
    log.error("blob %s changed while it was served; the response was cut off", digest)


def accel_file(
    services: Services, digest: str, prefix: str, root: Path, hash_first: bool
) -> File | Literal["absent", "unverified"]:
    """The blob's file for nginx to send (``accel_redirect_prefix``), when its file is
    verified and unchanged; ``hash_first``, hashed now if it is not (a corrupt one is
    quarantined). ``unverified``: serve it here (not hashed, or changed as it was)."""
    blobs = services.blobs
    if not hash_first:
        stamped = blobs.stamp(digest)
        size = blobs.size(digest)
        if size is None:
            return "absent"
        services.blob_use.touch((digest,))  # as any read: the evictor leaves it alone
        if stamped is None or not services.verified.trusted(digest, stamped[0]):
            return "unverified"
        return _file(blobs, digest, size, prefix, root)
    verdict = verify(blobs, services.verified, services.metrics, digest, "read")
    if verdict is Verdict.CHANGED:
        return "unverified"  # it changed while it was hashed: the ordinary path hashes it again
    size = blobs.size(digest)
    if verdict is not Verdict.SOUND or size is None:
        return "absent"
    return _file(blobs, digest, size, prefix, root)


def _file(
    blobs: BlobStore, digest: str, size: int, prefix: str, root: Path
) -> File | Literal["absent"]:
    path = blobs.local_path(digest)
    if path is None:
        return "absent"
    return File(f"{prefix}/{path.relative_to(root).as_posix()}", size)


def _presigned(services: Services, digest: str, size: int) -> Presigned | None:
    """A presigned URL of a blob known to exist, when the settings ask for one and the
    store can presign; None to serve it here. A store that fails to sign (no
    credentials to sign with) is logged and the blob served here: a redirect is an
    optimisation, never a reason for a download to fail."""
    settings = services.settings
    presign = getattr(services.blobs, "presign", None)
    if not settings.blob_redirect_seconds or presign is None:
        return None
    if size < settings.blob_redirect_min_bytes:
        return None
    try:
        url = presign(digest, settings.blob_redirect_seconds)
    except StoreError as exc:
        log.warning("cannot presign blob %s (%s); serving it", digest, exc)
        return None
    return Presigned(str(url), size)


def _verified(
    blobs: BlobStore, digest: str, size: int, span: tuple[int, int] | None
) -> Read | None:
    """A whole small blob, or a range of any blob, hashed in full before it is sent."""
    # A whole small blob in one read (fs.py), as it is sent; a large one in chunks.
    chunks = blobs.read(digest, 0, size if span is None else None)
    if chunks is None:
        return None
    if span is None:
        data = b"".join(chunks)
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest() != digest:
            raise CorruptBlob(digest)
        return Whole(data)
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
        return None
    return Chunks(part, start, end, size, blocking=True)


def _trusted(
    services: Services,
    digest: str,
    size: int,
    span: tuple[int, int] | None,
    unchanged: Callable[[Iterator[bytes]], bool],
) -> Read | Literal["changed"] | None:
    """A blob whose file was verified and had not changed since (verified.py), sent
    unhashed; ``changed`` when its file changed while it was read. The stamp is checked
    again after the last byte is read and before it is sent (the last chunk is held
    back), so a write that lands during the read breaks the response off."""
    start, end = span if span is not None else (0, size)
    chunks = services.blobs.read(digest, start, end)
    if chunks is None:
        return None
    if span is None and size <= VERIFY_FIRST:
        body = b"".join(chunks)  # small: one write, as a verified small blob is sent
        if not unchanged(chunks):
            return "changed"
        return Whole(body)

    def still_verified() -> bool:
        if unchanged(chunks):
            return True
        _cut_off(services, digest)
        return False

    checked = services.blob_use.streaming(digest, _hold_last(chunks, digest, still_verified))
    # As for a verified stream: no thread-pool hop per chunk of a local file.
    return Chunks(checked, start, end, size, blocking=not services.inline)


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


_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")  # at most int64 digits


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
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
