"""Wake-ups for long-polling requests: a request waiting for a name (a key, an alias)
sleeps on a future until a publish or a lease release through this process sets it,
or until its timeout. Waiting costs no CPU and no index reads.

A waiter registers before it reads the index (``watch``), so an event that lands
while it reads still wakes it. Only this process's events wake anyone: a publish
through another replica is seen when the waiter's timeout (``lease_recheck_seconds``
at most) makes it look again. Everything runs on the event loop, so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class Wakeups:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

    @contextmanager
    def watch(self, namespace: str, name: str) -> Iterator[asyncio.Future[None]]:
        """A future that ``notify`` of (namespace, name) sets from now on; wait on it
        with ``sleep``. Register before looking, so nothing between is missed."""
        place = (namespace, name)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(place, set()).add(future)
        try:
            yield future
        finally:
            waiting = self._waiting.get(place)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiting[place]

    @staticmethod
    async def sleep(future: asyncio.Future[None], timeout: float) -> bool:
        """Sleep until ``future`` is set or ``timeout`` seconds pass; True when woken."""
        done, _ = await asyncio.wait({future}, timeout=max(0.0, timeout))
        return bool(done)

    async def wait(self, namespace: str, name: str, timeout: float) -> bool:
        """Register and sleep at once (when nothing needs looking at in between)."""
        with self.watch(namespace, name) as future:
            return await self.sleep(future, timeout)

    def notify(self, namespace: str, names: Iterable[str]) -> None:
        """Wake every request waiting on one of ``names``."""
        for name in names:
            for future in self._waiting.pop((namespace, name), ()):
                if not future.done():
                    future.set_result(None)

    def waiting(self) -> int:
        """How many requests wait now (for tests and metrics)."""
        return sum(len(futures) for futures in self._waiting.values())
