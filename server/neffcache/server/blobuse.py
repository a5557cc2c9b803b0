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
from collections import OrderedDict
from collections.abc import Iterable, Iterator


class BlobUse:
    def __init__(self, keep_seconds: float = 3600.0) -> None:
        # Digest -> monotonic time of last use, least recently used first, so that
        # forgetting what is older than ``keep_seconds`` pops from the front: a touch
        # costs O(1) however many digests are remembered.
        self._last: OrderedDict[str, float] = OrderedDict()
        self._keep = keep_seconds
        self._lock = threading.Lock()

    def touch(self, digests: Iterable[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for digest in digests:
                self._last[digest] = now
                self._last.move_to_end(digest)
            cutoff = now - self._keep
            while self._last:
                oldest = next(iter(self._last.values()))
                if oldest >= cutoff:
                    break
                self._last.popitem(last=False)

    def used_within(self, digest: str, seconds: float) -> bool:
        with self._lock:
            last = self._last.get(digest)
        return last is not None and time.monotonic() - last < seconds

    def streaming(self, digest: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """The chunks, the blob touched as each goes out."""
        for chunk in chunks:
            self.touch((digest,))
            yield chunk
