"""The blob store interface: immutable bytes addressed by their BLAKE3 digest.

Uploads go through a staging file the server writes and verifies itself (digest and
length) before ``commit`` publishes it; a store never sees unverified bytes, and a
killed upload leaves only a staging file, which ``open_blob_store`` removes at start-up.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from neffcache.protocol import HEX64

# Digests are validated by the API before any store call; stores may rely on it.
DIGEST_PATTERN = HEX64


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    modified: float  # epoch seconds the blob was stored (last written)


class BlobStore(Protocol):
    """An implementation may set a class attribute ``local = True`` when it answers
    from this machine's disk or memory; the server then calls it on its event loop
    instead of a worker thread. Without it, calls go to worker threads. One whose
    ``stamp`` can let a read skip hashing sets ``scrubbed = True``: the background scrub
    then reads and hashes every blob on a schedule (scrub.py).

    Content-addressed blobs. Every method is safe to call from several threads."""

    def staging_dir(self) -> Path:
        """A local directory for upload files; for a filesystem store, on the same
        filesystem as the blobs, so ``commit`` is a rename."""

    def commit(self, staged: Path, digest: str) -> bool:
        """Publish ``staged`` (already verified to hash to ``digest``) atomically and
        remove it. True if stored now, False if the blob was already there.
        Raises StoreFull when out of space (nothing partial stays), StoreError else."""

    def size(self, digest: str) -> int | None:
        """The blob's size, or None if it is absent (or quarantined)."""

    def read(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes] | None:
        """Chunks of bytes [start, end) of the blob, or None if it is absent. The
        iterator may raise StoreError if the backend fails midway."""

    def stamp(self, digest: str) -> tuple[Hashable, float] | None:
        """What the stored blob's file is now (a value that changes whenever its bytes
        may have) and when it last changed (epoch seconds); None when the store cannot
        tell, and then every read is verified in full (verified.py)."""

    def local_path(self, digest: str) -> Path | None:
        """A local file holding the blob, for zero-copy serving; None when the store
        has none (S3) or the blob is absent."""

    def quarantine(self, digest: str) -> None:
        """Move a blob whose bytes no longer match its digest out of the way; after
        this ``size`` says absent and a new upload can heal it."""

    def delete(self, digest: str) -> bool:
        """Remove a blob; False if it was absent. A read already under way on this
        process keeps its bytes where the backend allows (an open file on POSIX);
        callers (the evictor) still avoid deleting what is being read."""

    def blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob (staging and quarantined files excluded), in no
        particular order, listed lazily: a blob stored or deleted during the listing
        may or may not appear. Raises StoreError if the backend fails midway."""

    def check(self) -> None:
        """Raise StoreError if the backend cannot be reached (readiness)."""

    def close(self) -> None:
        """Release connections and handles."""
