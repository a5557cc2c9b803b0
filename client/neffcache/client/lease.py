"""Compile leases: one compile of a graph across the fleet (docs/client.md, "Leases").

A client that missed everywhere asks the server for the lease on the graph before
compiling it. The first asker holds it, compiles, and renews it in the background
until it publishes or fails; every other asker waits for the holder's entry with a
long-poll (the server answers the moment the entry is published, or when the
holder's lease runs out and this waiter may take over).

A lease is an optimisation, never a way to hang a job: no answer from the server
means compiling now, and a waiter compiles itself once the holder has held the lease
for longer than ``2 * expected + 2 * TTL`` (the expected compile time when the server
knows one, else ``NEFFCACHE_LEASE_WAIT``). Waiting through a chain of holders that die
is capped at twice the first bound.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import NamedTuple

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.remote import LeaseAnswer, Manifest, Remote
from neffcache.client.stats import STATS

# The longest single long-poll request; the server may answer sooner (its own cap).
_POLL = 30.0


class Wait(NamedTuple):
    """What to do after asking: ``done`` (``entry`` is the published entry), ``granted``
    (compile, then ``release``), ``failed`` (the holder's compile failed) or
    ``compile`` (no lease: compile without one; ``reason`` says why)."""

    state: str
    entry: Manifest | None = None
    reason: str = ""


def holder_name() -> str:
    return f"{os.uname().nodename} pid {os.getpid()}"


class Leases:
    def __init__(self, remote: Remote, config: ClientConfig) -> None:
        self.remote = remote
        self.config = config
        self._held: dict[str, tuple[str, float]] = {}  # name -> (lease id, ttl)
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire_or_wait(
        self, name: str, expected: float | None = None, began: float | None = None
    ) -> Wait:
        """Hold the lease on ``name``, or wait for whoever holds it (see the module).
        ``began`` (``time.time()``): when the caller began waiting for this graph (on
        a local lock, say), so that a failure since then is reported to it."""
        if not self.config.leases:
            return Wait("compile", reason="leases are off (NEFFCACHE_LEASES=0)")
        with self._lock:
            if name in self._held:
                # Asked again by the holder itself (the SDK probes before and after
                # taking its entry lock): waiting would be waiting for ourselves.
                return Wait("granted")
        started = time.monotonic()
        earlier = 0.0 if began is None else max(0.0, time.time() - began)
        give_up_at: float | None = None
        cap: float | None = None
        poll = 0.0  # the first question does not wait: its answer sets the bound
        dead: str | None = None
        while True:
            waited = earlier + time.monotonic() - started
            answer = self.remote.lease(
                name, poll, holder_name(), expected=expected, waited=waited, dead_holder=dead
            )
            if answer is None:
                return Wait("compile", reason="the server gave no lease")
            if answer.state == "done" and answer.entry is not None:
                if give_up_at is not None:
                    STATS.count("lease_waits")
                return Wait("done", entry=answer.entry)
            if answer.state == "granted" and answer.lease:
                self._hold(name, answer.lease, answer.ttl)
                STATS.count("leases_held")
                return Wait("granted")
            if answer.state == "failed":
                STATS.count("lease_failures_seen")
                return Wait("failed", reason=f"{answer.holder} failed to compile it")
            if answer.state != "held":
                return Wait("compile", reason=f"the server answered {answer.state!r}")
            if answer.holder != dead and _dead_here(answer.holder):
                # Killed on this host: its lease would outlive it by up to a TTL.
                dead, poll = answer.holder, 0.0
                continue
            now = time.monotonic()
            bound = _bound(answer, self.config.lease_wait)
            if cap is None:
                cap = started + 2 * bound
                log.info("neffcache: %s compiles %s; waiting for it", answer.holder, name[:24])
            # Per holder: a new holder (after a take-over) started a new compile.
            limit = now + max(0.0, bound - answer.held_for)
            give_up_at = min(cap, limit if give_up_at is None else max(give_up_at, limit))
            if now >= give_up_at:
                STATS.count("lease_waits_abandoned")
                waited = now - started
                return Wait("compile", reason=f"waited {waited:.0f} s for {answer.holder}")
            poll = min(_POLL, give_up_at - now)

    def release(self, name: str, failed: bool = False) -> None:
        """End a held lease (after publishing, or after a failed compile)."""
        with self._lock:
            held = self._held.pop(name, None)
        if held is not None:
            self.remote.release(name, held[0], failed)

    def release_all(self) -> None:
        with self._lock:
            names = list(self._held)
        for name in names:
            self.release(name)

    # -- renewing ---------------------------------------------------------------------

    def _hold(self, name: str, lease_id: str, ttl: float) -> None:
        with self._lock:
            self._held[name] = (lease_id, ttl)
            if self._renewer is None:
                # One thread per process renews every lease it holds; a holder that
                # dies stops renewing, and its lease runs out for a waiter to take.
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="neffcache-lease", daemon=True
                )
                self._renewer.start()
                atexit.register(self.release_all)
        self._changed.set()

    def _renew_loop(self) -> None:
        while True:
            with self._lock:
                held = dict(self._held)
            if not held:
                self._changed.wait()
                self._changed.clear()
                continue
            # A third of the shortest lifetime: two renewals may fail before it ends.
            self._changed.wait(min(ttl for _, ttl in held.values()) / 3)
            self._changed.clear()
            for name, (lease_id, _) in held.items():
                with self._lock:
                    if self._held.get(name, ("",))[0] != lease_id:
                        continue  # released meanwhile
                if self.remote.renew(name, lease_id) is False:
                    STATS.count("leases_lost")
                    log.warning("neffcache: lost the lease on %s; still compiling", name[:24])
                    with self._lock:
                        if self._held.get(name, ("",))[0] == lease_id:
                            del self._held[name]


def _dead_here(holder: str) -> bool:
    """Whether ``holder`` (``holder_name()`` of some process) was a process on this
    host that no longer exists."""
    host, sep, pid = holder.rpartition(" pid ")
    if not sep or host != os.uname().nodename or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def _bound(answer: LeaseAnswer, default: float) -> float:
    expected = answer.expected_seconds
    return 2 * answer.ttl + (2 * expected if expected is not None else default)
