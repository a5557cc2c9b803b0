"""Counters of what the client did in this process: hits, misses, fall-backs.

Every time the cache could not help (server down, timeout, bad bytes, a failed
publish) one named counter goes up, so "the cache never fails a job" stays visible
instead of silent. The run manifest ends with a snapshot; telemetry will send them.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

from neffcache.protocol.counters import ClientCounter


class Stats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, event: ClientCounter | str, n: int = 1) -> None:
        """Add ``n`` to ``event``'s counter. The client counts ``ClientCounter``s, the
        names the server's metrics label; a plain string is a test's own name."""
        name = event.value if isinstance(event, ClientCounter) else event
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))

    def reset(self) -> None:
        """Back to none, as in a new process (the hit daemon, before each request)."""
        with self._lock:
            self._counts.clear()


STATS = Stats()


def _after_fork_in_child() -> None:
    # The child has only the thread that forked: a lock another thread held at the fork
    # (the telemetry sender counts every second) would never be released in it.
    STATS._lock = threading.Lock()


# Registered at import, so before telemetry's own hook, which reads the counters.
os.register_at_fork(after_in_child=_after_fork_in_child)
