"""Which blobs this replica served or was asked about lately.

The evictor never removes a blob that was read, or probed by a publisher about to
reference it, within ``blob_grace_seconds`` on this replica: a download in progress
touches its blob with every chunk, so it is never cut off. Other replicas' reads are
covered by the grace period itself (an entry's blobs outlive the entry by at least
that long) and, on a filesystem store, by POSIX: an open file survives its unlink.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

# Past this many remembered digests, those not used within the longest grace go.
_PRUNE_AT = 100_000


class BlobUse:
    def __init__(self) -> None:
        self._last: dict[str, float] = {}  # digest -> monotonic time of last use
        self._lock = threading.Lock()

    def touch(self, digests: Iterable[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for digest in digests:
                self._last[digest] = now
            if len(self._last) > _PRUNE_AT:
                cutoff = now - 86400.0
                self._last = {d: t for d, t in self._last.items() if t > cutoff}

    def used_within(self, digest: str, seconds: float) -> bool:
        with self._lock:
            last = self._last.get(digest)
        return last is not None and time.monotonic() - last < seconds

    def streaming(self, digest: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The chunks, the blob touched as each goes out."""
        for chunk in chunks:
            self.touch((digest,))
            yield chunk
