"""What each namespace holds (``Evictor.usage``: a scan of its entry stats),
remembered for ``ttl`` seconds per namespace: one memo per app serves the reports'
storage figures and the metrics' per-namespace gauges.

A dashboard asks for a report every few seconds and Prometheus scrapes every few
more; without the memo each would list every entry of every namespace again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from neffcache.server.eviction.evictor import Evictor, Usage

DEFAULT_TTL = 60.0
_MAX_NAMESPACES = 10_000


class UsageMemo:
    def __init__(
        self,
        evictor: Evictor,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._evictor = evictor
        self._ttl = ttl
        self._clock = clock
        self._held: dict[str, tuple[float, Usage]] = {}
        self._lock = threading.Lock()

    def usage(self, namespace: str) -> Usage:
        now = self._clock()
        with self._lock:
            known = self._held.get(namespace)
        if known is not None and now - known[0] < self._ttl:
            return known[1]
        # Scanned outside the lock: two requests may both scan, never block each other.
        held = self._evictor.usage(namespace)
        with self._lock:
            if len(self._held) >= _MAX_NAMESPACES:
                self._held.clear()
            self._held[namespace] = (now, held)
        return held
