"""The leases that let one replica at a time run a background job (the evictor, the
scrub). They live in the ``_system`` namespace, which is not a valid namespace name,
so no client can take or release one.

``hold`` takes or renews one; ``LeasedThread`` is the daemon thread such a job runs
in, with its lease: started and stopped with the app, the lease given up on the way
out (it would expire on its own, but another replica takes over sooner).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from typing import ClassVar

from neffcache.server.errors import StoreError
from neffcache.server.index import Index, Lease

SYSTEM = "_system"


def hold(index: Index, name: str, lease_id: str, actor: str, now: float, ttl: float) -> bool:
    """Take or renew the lease ``name`` as ``lease_id`` until ``now + ttl``; False while
    another replica holds it."""
    if index.renew_lease(SYSTEM, name, lease_id, now + ttl):
        return True
    mine = Lease(SYSTEM, name, lease_id, actor, now, now + ttl)
    return index.acquire_lease(mine).lease_id == lease_id


class LeasedThread:
    """A replica's background job: a daemon thread that calls ``turn`` (which says how
    long to wait before the next), and the ``_system`` lease ``lease`` by which one
    replica at a time does the job's work (``hold_lease``).

    A subclass names its ``lease``, its ``role`` (the holder's name, for people), what
    a failure is of (``what``) and its ``log``; it defines ``turn`` and ``idle``, and
    may define ``first_wait`` and ``stopped``. A failing turn is logged and the thread
    waits ``idle()`` seconds: a store that is down, or a bug, must not end it for good.
    """

    lease: ClassVar[str]
    role: ClassVar[str]
    what: ClassVar[str]
    log: ClassVar[logging.Logger]
    # Seconds ``stop`` waits for a turn under way to end.
    stop_wait: ClassVar[float] = 30.0

    def __init__(self, index: Index) -> None:
        self.index = index
        self.actor = f"{self.role}@{os.uname().nodename} pid {os.getpid()}"
        self._lease_id = secrets.token_hex(16)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False  # whether this replica ever took the lease

    # --- what a job defines

    def turn(self) -> float:
        """One turn of the thread; the seconds until the next."""
        raise NotImplementedError

    def idle(self) -> float:
        """The seconds between turns after a failed one."""
        raise NotImplementedError

    def first_wait(self) -> float:
        """The seconds from ``start`` to the first turn."""
        return self.idle()

    def stopped(self) -> None:
        """What is left to do once the thread has ended (before the lease is given up)."""

    # --- the lease

    def hold_lease(self, now: float, ttl: float) -> bool:
        """Take or renew the lease until ``now + ttl``; False while another replica
        holds it."""
        if not hold(self.index, self.lease, self._lease_id, self.actor, now, ttl):
            return False
        self._held = True
        return True

    def release_lease(self) -> None:
        with contextlib.suppress(StoreError):  # it expires on its own
            self.index.release_lease(SYSTEM, self.lease, self._lease_id, None)

    # --- the thread

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            name = f"neffcache-{type(self).__name__.lower()}"  # neffcache-maintenance, …
            self._thread = threading.Thread(target=self._loop, name=name)
            self._thread.daemon = True
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, waiting up to ``stop_wait`` seconds for a turn under way
        (which ``running`` tells to end sooner), then ``stopped``; the lease is given
        up if it was ever taken. A turn still running after that keeps both: another
        replica must not start the job while this one still does it, and the lease
        expires on its own."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout=self.stop_wait)
            if thread.is_alive():
                self.log.warning(
                    "%s still running %.0f s after it was told to stop; its lease is left"
                    " to expire",
                    self.what,
                    self.stop_wait,
                )
                return
        self.stopped()
        if self._held:
            self.release_lease()

    def running(self, wait: float = 0.0) -> bool:
        """Wait ``wait`` seconds, less if ``stop`` is called; whether to go on."""
        return not self._stop.wait(wait)

    def _loop(self) -> None:
        wait = self.first_wait()
        while self.running(wait):
            try:
                wait = self.turn()
            except StoreError as exc:
                wait = self.idle()
                self.log.warning("%s failed (tried again in %.0f s): %s", self.what, wait, exc)
            except Exception:  # a bug must not end the thread for good
                wait = self.idle()
                self.log.exception("%s failed", self.what)
