"""Which blobs were hashed in full and found right, and by which file.

Every blob is hashed on its first read and again whenever its file may have changed:
the memo keys each verified blob by its file's stamp (device, inode, size, mtime and
ctime in nanoseconds), and any write, truncation or replacement of the file changes
that stamp (the kernel sets ctime on every change; no user can set it back). While
the stamp is the one that was verified, and for at most ``reverify_seconds``, a read
streams the file without hashing it again: hashing is most of what a large GET
costs. Corruption beneath the filesystem (a disk's bit rot), which no stamp shows,
is caught at the next re-verification: by the scrub, which hashes every blob once per
``scrub_interval_seconds`` and remembers the sound ones again, or at once when a
client, which verifies each download itself, reports a mismatch (scrub.py).

A file changed within ``_RACY`` seconds before its stamp was taken is not remembered
(git's "racily clean" rule): a filesystem with coarse timestamps (one second on some)
may give a change made in the same tick the same ctime. A trusted read checks the
stamp again after reading, before its last bytes go out (services/blobs.py).

Not covered: writes through a shared memory mapping to a page that is already dirty
do not update mtime or ctime (the kernel stamps the first write after a writeback), so
such a change is caught only at the next re-verification (and by clients).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable

_RACY = 2.0  # seconds
_ENTRIES = 16384  # about 8 MiB of memo at most (measured: ~0.5 KiB an entry)


class VerifiedMemo:
    def __init__(self, lifetime: float, entries: int = _ENTRIES) -> None:
        self._lifetime = lifetime
        self._entries = entries
        self._memo: OrderedDict[str, tuple[Hashable, float]] = OrderedDict()
        self._lock = threading.Lock()

    def trusted(self, digest: str, stamp: Hashable | None) -> bool:
        """Whether the blob's file, as ``stamp`` says it is now, was verified lately."""
        if stamp is None or self._lifetime <= 0:
            return False
        with self._lock:
            found = self._memo.get(digest)
            if found is None:
                return False
            if found[0] != stamp or time.monotonic() - found[1] > self._lifetime:
                del self._memo[digest]
                return False
            self._memo.move_to_end(digest)
            return True

    def remember(
        self, digest: str, stamp: Hashable | None, changed_at: float | None, seen_at: float
    ) -> None:
        """The blob's file, stamped ``stamp`` at ``seen_at`` (epoch seconds, before its
        reading began) and last changed at ``changed_at``, hashed to its digest."""
        if stamp is None or changed_at is None or self._lifetime <= 0:
            return
        if seen_at - changed_at < _RACY:
            return
        with self._lock:
            self._memo[digest] = (stamp, time.monotonic())
            self._memo.move_to_end(digest)
            while len(self._memo) > self._entries:
                self._memo.popitem(last=False)

    def forget(self, digest: str) -> None:
        with self._lock:
            self._memo.pop(digest, None)
