"""How many reports one server process computes at once, and how many may wait.

A report runs in a worker thread, off the event loop, but it is CPU-bound Python: it
holds the GIL while it parses events, and the loop (every lookup and download) must
win the GIL back from it. Two reports in two threads are no faster than one after the
other (one GIL), and each more thread is one more to take the GIL from the loop. So
one report at a time per process; the next ones wait their turn, at most
``waiting`` of them (a dashboard asks for three at once); further requests are
refused with ``ReportsBusy`` (``503`` and ``Retry-After``) instead of piling up.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# A refused request is told to come back after the reports ahead of it, as long as
# the last report took each, within these bounds.
MIN_RETRY_SECONDS = 1
MAX_RETRY_SECONDS = 60


class ReportsBusy(Exception):
    """As many reports wait as may; ``retry_after`` seconds is a fair guess of when
    one more would be taken."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(
            f"{waiting} reports are waiting for the one being computed; "
            f"ask again in {retry_after} s"
        )
        self.retry_after = retry_after


class ReportGate:
    """``running`` reports at once, ``waiting`` more queued, for one event loop (an
    asyncio semaphore belongs to the loop it first waits on)."""

    def __init__(self, running: int, waiting: int, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._slots = asyncio.Semaphore(running)
        self._at_once = running
        self._waiting_max = waiting
        self._waiting = 0
        self._last_seconds = 0.0  # how long the last report held its turn

    @property
    def waiting(self) -> int:
        return self._waiting

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the report turns; raises ReportsBusy when the queue is full.
        Nothing awaits between the check and the count, so the bound is exact."""
        if self._slots.locked() and self._waiting >= self._waiting_max:
            raise ReportsBusy(self._waiting, self._retry_after())
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        started = time.monotonic()
        try:
            yield
        finally:
            self._last_seconds = time.monotonic() - started
            self._slots.release()

    def _retry_after(self) -> int:
        ahead = (self._waiting + self._at_once) / self._at_once
        guess = math.ceil(ahead * self._last_seconds)
        return min(MAX_RETRY_SECONDS, max(MIN_RETRY_SECONDS, guess))


def gate_of(state: Any, running: int, waiting: int) -> ReportGate:
    """The app's gate (kept on its ``state``, whatever holds attributes) for the
    running event loop, made on first use; nothing awaits between looking and setting.
    Tests run one app on several loops, one after the other."""
    loop = asyncio.get_running_loop()
    found: ReportGate | None = getattr(state, "reports_gate", None)
    if found is None or found.loop is not loop:
        found = state.reports_gate = ReportGate(running, waiting, loop)
    return found
