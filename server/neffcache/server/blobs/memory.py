"""An in-memory blob store: the shipped fake for tests, and ``memory://`` for trials."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

from .base import BlobInfo
from .documents import check_name, check_prefix

_CHUNK = 1 << 20


class MemoryBlobStore:
    # Answers come from this machine: the server may call it on its event loop.
    local = True

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._stored_at: dict[str, float] = {}  # digest -> epoch seconds of its commit
        self._documents: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._staging = tempfile.TemporaryDirectory(prefix="neffcache-staging-")

    @classmethod
    def from_url(cls, url: str) -> MemoryBlobStore:
        return cls()

    def staging_dir(self) -> Path:
        return Path(self._staging.name)

    def commit(self, staged: Path, digest: str) -> bool:
        data = staged.read_bytes()
        staged.unlink()
        with self._lock:
            if digest in self._blobs:
                return False
            self._blobs[digest] = data
            self._stored_at[digest] = time.time()
            return True

    def size(self, digest: str) -> int | None:
        with self._lock:
            data = self._blobs.get(digest)
        return None if data is None else len(data)

    def read(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes] | None:
        with self._lock:
            data = self._blobs.get(digest)
        if data is None:
            return None
        view = memoryview(data)[start:end]
        return (bytes(view[i : i + _CHUNK]) for i in range(0, len(view), _CHUNK))

    def stamp(self, digest: str) -> tuple[Hashable, float] | None:
        return None  # nothing tells a change apart: every read is verified

    def local_path(self, digest: str) -> Path | None:
        return None

    def quarantine(self, digest: str) -> None:
        self.delete(digest)

    def delete(self, digest: str) -> bool:
        with self._lock:
            self._stored_at.pop(digest, None)
            return self._blobs.pop(digest, None) is not None

    def blobs(self) -> Iterator[BlobInfo]:
        # A snapshot taken when the listing starts: stores and deletes after that are
        # not seen, which the protocol allows.
        with self._lock:
            snapshot = [
                BlobInfo(digest, len(data), self._stored_at[digest])
                for digest, data in self._blobs.items()
            ]
        yield from snapshot

    def put_document(self, name: str, data: bytes, *, create_only: bool = False) -> bool:
        with self._lock:
            if create_only and check_name(name) in self._documents:
                return False
            self._documents[check_name(name)] = bytes(data)
            return True

    def get_document(self, name: str) -> bytes | None:
        with self._lock:
            return self._documents.get(check_name(name))

    def delete_document(self, name: str) -> bool:
        with self._lock:
            return self._documents.pop(check_name(name), None) is not None

    def documents(self, prefix: str) -> Iterator[str]:
        check_prefix(prefix)
        with self._lock:
            snapshot = [name for name in self._documents if name.startswith(prefix)]
        yield from snapshot

    def check(self) -> None:
        return None

    def close(self) -> None:
        self._staging.cleanup()

    def corrupt(self, digest: str, data: bytes) -> None:
        """Replace a blob's bytes behind the store's back (tests of corruption at rest)."""
        with self._lock:
            self._blobs[digest] = data
            # Bytes changed at rest: the blob was not stored again, so its time stays.
            self._stored_at.setdefault(digest, time.time())
