"""Which entries were served, when: the last-access times that expiry and the value
ranking read, on the server's clock only (a client's clock never enters).

A hit is one dictionary update in memory; the maintenance thread writes the batch to
the index every ``access_flush_seconds`` (``Index.touch_entries``), so the hit path
never waits for a write. A replica killed between flushes loses at most that many
seconds of access times, which only makes its entries look a little older.
"""

from __future__ import annotations

import threading
import time

from neffcache.server.index import Index, Touch


class AccessLog:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], list[float]] = {}  # [last, hits]
        self._lock = threading.Lock()

    def hit(self, namespace: str, key: str, at: float | None = None) -> None:
        now = time.time() if at is None else at
        with self._lock:
            seen = self._pending.get((namespace, key))
            if seen is None:
                self._pending[(namespace, key)] = [now, 1]
            else:
                seen[0] = max(seen[0], now)
                seen[1] += 1

    def drain(self) -> list[Touch]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return [Touch(ns, key, last, int(hits)) for (ns, key), (last, hits) in pending.items()]

    def flush(self, index: Index) -> int:
        """Write what was recorded; on a store error the batch is put back (merged with
        what arrived since) and the error raised. Returns how many entries were written."""
        touches = self.drain()
        if not touches:
            return 0
        try:
            index.touch_entries(touches)
        except BaseException:
            for touch in touches:
                self._merge(touch)
            raise
        return len(touches)

    def _merge(self, touch: Touch) -> None:
        with self._lock:
            seen = self._pending.setdefault((touch.namespace, touch.key), [touch.at, 0])
            seen[0] = max(seen[0], touch.at)
            seen[1] += touch.hits
