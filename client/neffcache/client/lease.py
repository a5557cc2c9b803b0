"""Compile leases: one compile of a graph across the fleet (docs/client.md, "Leases").

A client that missed everywhere asks the server for the lease on the graph before
compiling it. The first asker holds it, compiles, and renews it in the background
until it publishes or fails; every other asker waits for the holder's entry with a
long-poll (the server answers the moment the entry is published, or when the
holder's lease runs out and this waiter may take over).

A lease is an optimisation, never a way to hang a job: no answer from the server
means compiling now, and a waiter compiles itself once the holder has held the lease
for longer than ``2 * TTL`` plus ``NEFFCACHE_LEASE_WAIT``, or plus ``2 * expected``
when that is shorter (the expected compile time, when the server tells one). So what
a holder claims can shorten a wait, never lengthen it past the waiter's own setting
(the server also caps what it tells: ``lease_expected_max_seconds``). Waiting through
a chain of holders that die is capped at twice the first bound.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from neffcache.client._log import log
from neffcache.client.config import ClientConfig
from neffcache.client.manifests import Manifest
from neffcache.client.remote import LeaseAnswer, Remote
from neffcache.client.stats import STATS
from neffcache.protocol.counters import ClientCounter

# The longest single long-poll request; the server may answer sooner (its own cap).
_POLL = 30.0


class Wait(NamedTuple):
    """What to do after asking: ``done`` (``entry`` is the published entry), ``granted``
    (compile, then ``release``), ``failed`` (the holder's compile failed; ``failure``
    is its record when the server has it), ``free`` (nobody holds it; asked without
    taking), ``local`` (a live process on this host holds it) or ``compile`` (no
    lease: compile without one; ``reason`` says why)."""

    state: str
    entry: Manifest | None = None
    reason: str = ""
    failure: dict[str, Any] | None = None  # the holder's failure record, when failed


def holder_name() -> str:
    """``<host> pid <pid>``, where ``<host>`` is the node name plus what tells this
    machine's boot and pid namespace apart: containers that share a host name (host
    networking) each have their own pids, and must not judge each other's dead."""
    return f"{_this_host()} pid {os.getpid()}"


def _this_host() -> str:
    parts = [os.uname().nodename]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8])
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass  # not Linux: the node name alone
    return "/".join(parts)


_shared: dict[tuple[str, str, str | None], Leases] = {}
_shared_lock = threading.Lock()


def reset_shared_leases() -> None:
    """Release and forget every shared ``Leases`` and close its connections (tests; a
    forked child, which must not renew its parent's leases)."""
    with _shared_lock:
        found = list(_shared.values())
        _shared.clear()
    for leases in found:
        leases.release_all()
        leases.remote.close()


def shared_leases(config: ClientConfig, before_exit: Callable[[], object] | None = None) -> Leases:
    """This process's leases for a server and namespace: one renewal thread, one exit
    handler, however many cache objects the SDK makes."""
    from neffcache.client.remote import Remote

    where = (config.server, config.namespace, config.token)
    with _shared_lock:
        leases = _shared.get(where)
        if leases is None:
            leases = _shared[where] = Leases(Remote(config), config, before_exit)
        return leases


class Leases:
    def __init__(
        self,
        remote: Remote,
        config: ClientConfig,
        before_exit: Callable[[], object] | None = None,
    ) -> None:
        """``before_exit``: run at interpreter exit before the leases still held are
        released (the hook's publish flush: a waiter woken by a release must find the
        entry, whichever of the two exit handlers was registered first)."""
        self.remote = remote
        self.config = config
        self._before_exit = before_exit
        self._held: dict[str, tuple[str, float]] = {}  # name -> (lease id, ttl)
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire_or_wait(
        self,
        name: str,
        expected: float | None = None,
        began: float | None = None,
        take: bool = True,
    ) -> Wait:
        """Hold the lease on ``name``, or wait for whoever holds it (see the module).
        ``began`` (``time.time()``): when the caller began waiting for this graph (on
        a local lock, say), so that a failure since then is reported to it. With
        ``take=False`` only wait: a free name answers ``free`` at once (the hook's
        first probe, which may well not be followed by a compile)."""
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
            asked_at = time.monotonic()
            waited = earlier + asked_at - started
            answer = self.remote.lease(
                name,
                poll,
                holder_name(),
                expected=expected,
                waited=waited,
                dead_holder=dead,
                take=take,
            )
            if answer is None:
                return Wait("compile", reason="the server gave no lease")
            if answer.state == "free":
                return Wait("free", reason="nobody compiles it")
            if answer.state == "done" and answer.entry is not None:
                if give_up_at is not None:
                    STATS.count(ClientCounter.LEASE_WAITS)
                return Wait("done", entry=answer.entry)
            if answer.state == "granted" and answer.lease:
                self._hold(name, answer.lease, answer.ttl)
                STATS.count(ClientCounter.LEASES_HELD)
                return Wait("granted")
            if answer.state == "failed":
                STATS.count(ClientCounter.LEASE_FAILURES_SEEN)
                reason = f"{answer.holder} failed to compile it"
                return Wait("failed", reason=reason, failure=answer.failure)
            if answer.state != "held":
                return Wait("compile", reason=f"the server answered {answer.state!r}")
            here = _on_this_host(answer.holder)
            if here is False:
                # Killed on this host: its lease would outlive it by up to a TTL.
                if answer.holder != dead:
                    dead, poll = answer.holder, 0.0
                    continue
            elif here:
                # A live process on this host: ranks of one host already wait for
                # each other on L1's locks, and it may be waiting on a lock we hold.
                return Wait("local", reason=f"{answer.holder} on this host compiles it")
            now = time.monotonic()
            bound = _bound(answer, self.config.lease_wait)
            if cap is None:
                cap = started + 2 * bound
                log.info("neffcache: %s compiles %s; waiting for it", answer.holder, name[:24])
            # Per holder: a new holder (after a take-over) started a new compile.
            limit = now + max(0.0, bound - answer.held_for)
            give_up_at = min(cap, limit if give_up_at is None else max(give_up_at, limit))
            if now >= give_up_at:
                STATS.count(ClientCounter.LEASE_WAITS_ABANDONED)
                waited = now - started
                return Wait("compile", reason=f"waited {waited:.0f} s for {answer.holder}")
            took = now - asked_at
            if poll > 0 and took < min(0.25, poll / 2):
                # Asked to wait, answered at once (a server that caps its long-polls at
                # zero, a proxy that cuts them): pace the questions instead of spinning.
                # A server that holds requests for less than asked is not paced.
                time.sleep(max(0.0, min(1.0, poll - took, give_up_at - now)))
                now = time.monotonic()
            poll = max(0.0, min(_POLL, give_up_at - now))

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

    def _at_exit(self) -> None:
        with self._lock:
            if not self._held:
                return
        if self._before_exit is not None:
            self._before_exit()
        self.release_all()

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
                atexit.register(self._at_exit)
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
            self._changed.wait(max(0.1, min(ttl for _, ttl in held.values()) / 3))
            self._changed.clear()
            for name, (lease_id, _) in held.items():
                with self._lock:
                    if self._held.get(name, ("",))[0] != lease_id:
                        continue  # released meanwhile
                if self.remote.renew(name, lease_id) is False:
                    STATS.count(ClientCounter.LEASES_LOST)
                    log.warning("neffcache: lost the lease on %s; still compiling", name[:24])
                    with self._lock:
                        if self._held.get(name, ("",))[0] == lease_id:
                            del self._held[name]


def _on_this_host(holder: str) -> bool | None:
    """For ``holder`` (``holder_name()`` of some process): True when it is a live
    process on this host, False when it was one and is gone, None when it is not
    on this host (or not a name we made)."""
    host, sep, pid = holder.rpartition(" pid ")
    if not sep or host != _this_host() or not pid.isdigit() or len(pid) > 9:
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _bound(answer: LeaseAnswer, most: float) -> float:
    """How long the holder may hold the lease before this waiter compiles itself: a
    holder (any write token) may claim any compile time and renew for ever, so the
    claim only ever shortens the waiter's own ``NEFFCACHE_LEASE_WAIT``."""
    expected = answer.expected_seconds
    wait = most if expected is None else min(2 * expected, most)
    return 2 * max(answer.ttl, 1.0) + wait
