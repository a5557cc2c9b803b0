"""Wake-ups for long-polling requests: a request waiting for a name (a key, an alias)
sleeps on a future until a publish or a lease release through this process sets it,
or until its timeout. Waiting costs no CPU and no index reads.

Only this process's events wake anyone: a publish through another replica is seen
when the waiter's timeout (``lease_recheck_seconds`` at most) makes it look again.
Everything runs on the event loop, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class Wakeups:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

    async def wait(self, namespace: str, name: str, timeout: float) -> bool:
        """Sleep until ``notify`` names (namespace, name) or ``timeout`` seconds pass;
        True when woken."""
        place = (namespace, name)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(place, set()).add(future)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, max(0.0, timeout))
                return True
            return False
        finally:
            waiting = self._waiting.get(place)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiting[place]

    def notify(self, namespace: str, names: Iterable[str]) -> None:
        """Wake every request waiting on one of ``names``."""
        for name in names:
            for future in self._waiting.pop((namespace, name), ()):
                if not future.done():
                    future.set_result(None)

    def waiting(self) -> int:
        """How many requests wait now (for tests and metrics)."""
        return sum(len(futures) for futures in self._waiting.values())
