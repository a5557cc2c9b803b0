"""One core for the servers under test, another for the load generator.

On a small machine the load generator and the server fight for the same CPUs, so an
unpinned ratio says as much about the scheduler as about the server (two quiet runs of
the same code once gave 0.80x and 0.37x nginx). Pinned, each server gets exactly one
core, the same one for neffcache and for nginx, and the client another: the figure is
per core and holds from one machine to the next.

Pinning works through inheritance: the benchmark pins itself to the server core while
it starts a server (every process and thread the server makes inherits the mask, nginx's
workers, uvicorn's thread pool and Redis alike), then to the client core while it
starts the load, then stays there. ``taskset -c N`` does the same from a shell.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Cores:
    server: int
    client: int

    def describe(self) -> str:
        return (
            f"pinned: servers under test on CPU {self.server}, the load generator on CPU "
            f"{self.client} (sched_setaffinity, as taskset -c)"
        )


def choose(mode: str) -> Cores | None:
    """``auto``: pin when this process may use two cores or more; ``on``: the same, but
    an error when it cannot; ``off``: never."""
    if mode == "off":
        return None
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        if mode == "on":
            raise SystemExit("--pin on needs two usable cores; this process has one")
        return None
    # The last two: CPU 0 takes most interrupts on many machines.
    return Cores(server=usable[-2], client=usable[-1])


@contextlib.contextmanager
def on(core: int | None) -> Iterator[None]:
    """Run the body (and every process it starts) on ``core``; ``None`` changes nothing."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def stay_on(core: int | None) -> None:
    """Pin this process for the rest of its life (the client side's core)."""
    if core is not None:
        os.sched_setaffinity(0, {core})


def median_and_spread(values: list[float]) -> tuple[float, float, float]:
    """The median, lowest and highest of ``values`` (the middle one of an odd count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[0], ordered[-1]
