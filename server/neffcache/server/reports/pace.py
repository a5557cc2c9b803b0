"""Pauses in a report's folding, so that the event loop gets the GIL back soon.

A report runs in a worker thread, but parsing and folding events is Python that holds
the GIL. When the event loop wakes (a request arrived, an SQLite read returned), it
must take the GIL back, and CPython hands it over only when the holder blocks or
when the waiter has waited a whole switch interval (``sys.getswitchinterval()``, 5 ms
by default); a lookup waits for it several times. So the folding blocks for a moment
after each ``SLICE_SECONDS`` of work: the loop waits at most about that long, and a
report takes at most ``PAUSE_SECONDS / SLICE_SECONDS`` (10 %) longer.

>>> list(paced([1, 2, 3], Pace()))
[1, 2, 3]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

# Work between pauses: well under the switch interval, long enough that the pauses
# cost little. A pause long enough for a waiting thread to wake and take the GIL.
SLICE_SECONDS = 0.002
PAUSE_SECONDS = 0.0002

T = TypeVar("T")


class Pace:
    """Call after each piece of work; it sleeps once per slice of work."""

    def __init__(
        self,
        slice_seconds: float = SLICE_SECONDS,
        pause_seconds: float = PAUSE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._slice, self._pause = slice_seconds, pause_seconds
        self._clock, self._sleep = clock, sleep
        self._due = clock() + slice_seconds

    def __call__(self) -> None:
        if self._clock() >= self._due:
            self._sleep(self._pause)  # blocks: the GIL goes to any thread waiting for it
            self._due = self._clock() + self._slice


def paced(items: Iterable[T], pace: Pace) -> Iterator[T]:
    """The items, with ``pace()`` after each one is handled."""
    for item in items:
        yield item
        pace()
