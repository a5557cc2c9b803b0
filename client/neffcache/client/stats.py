"""Counters of what the client did in this process: hits, misses, fall-backs.

Every time the cache could not help (server down, timeout, bad bytes, a failed
publish) one named counter goes up, so "the cache never fails a job" stays visible
instead of silent. The run manifest ends with a snapshot; telemetry will send them.
"""

from __future__ import annotations

import threading
from collections import Counter


class Stats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self._counts[event] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))


STATS = Stats()
