"""The background work of a replica: write access times, and (on one replica at a
time) apply expiry, retention and quotas, then collect unreferenced blobs.

It runs in one daemon thread, off the request path. Which replica evicts is decided by
a lease in the index (``_system``/``evictor``, a namespace no client can name): the
replica holding it renews it on every tick and passes it on only by dying. Two
replicas evicting at once (a pass that outlived its lease) would only duplicate work:
removals are conditional (``delete_entry``) and blobs wait out their grace period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from neffcache.server.access import AccessLog
from neffcache.server.errors import StoreError
from neffcache.server.eviction.evictor import Applied, Collected, Evictor
from neffcache.server.eviction.plan import Plan
from neffcache.server.index import Index
from neffcache.server.settings import ServerSettings
from neffcache.server.system_lease import SYSTEM, LeasedThread

log = logging.getLogger("neffcache.server.eviction")

LEADER = "evictor"


@dataclass
class Pass:
    plans: list[Plan] = field(default_factory=list)
    applied: Applied = field(default_factory=Applied)
    collected: Collected = field(default_factory=Collected)
    # Blob collection skipped: the index may lack entries (lost or wiped, and not yet
    # rebuilt; recovery/), so every blob could look unreferenced.
    paused: bool = False
    seconds: float = 0.0


class Recovery(Protocol):
    """Rebuilding a lost index (recovery/reindex.py ``IndexRecovery``)."""

    def intact(self) -> bool:
        """Whether the index is known complete (cheap: asked every tick)."""

    def complete(self, leading: Callable[[], bool]) -> bool:
        """Rebuild the index if it was lost; whether it is complete now."""

    def reconciled(self, leading: Callable[[], bool]) -> bool:
        """Before a collection: whether the index names every documented entry."""


class _Intact:
    def intact(self) -> bool:
        return True

    def complete(self, leading: Callable[[], bool]) -> bool:
        return True

    def reconciled(self, leading: Callable[[], bool]) -> bool:
        return True


class Maintenance(LeasedThread):
    lease = LEADER
    role = "evictor"
    what = "background maintenance"
    log = log

    def __init__(
        self,
        index: Index,
        evictor: Evictor,
        access: AccessLog,
        settings: ServerSettings,
        recovery: Recovery | None = None,
    ) -> None:
        """``recovery`` rebuilds a lost index (recovery/reindex.py ``IndexRecovery``);
        None for an index with nothing to rebuild it from."""
        super().__init__(index)
        self.recovery = recovery or _Intact()
        self.evictor = evictor
        self.access = access
        self.settings = settings
        self._pass_lock = threading.Lock()
        self._last_pass = 0.0

    # --- the thread (LeasedThread)

    def idle(self) -> float:
        interval = self.settings.eviction_interval_seconds
        tick = self.settings.access_flush_seconds
        return min(tick, interval) if interval > 0 else tick

    def turn(self) -> float:
        self.tick()
        return self.idle()

    def stopped(self) -> None:
        self.flush()  # the hits recorded since the last tick

    def tick(self) -> None:
        """One turn of the background thread."""
        self.flush()
        interval = self.settings.eviction_interval_seconds
        # With eviction off no replica holds the lease, unless the index was lost: it
        # is rebuilt within a tick either way (its tokens were lost with it, so
        # every client is refused until then).
        if interval <= 0 and self.recovery.intact():
            return
        # Renewed every tick, not only per pass: the lease outlives no tick, so a
        # dead evictor is replaced within three ticks.
        if not self.lead():
            return
        with self._pass_lock:
            self.recovery.complete(self.lead)
        if interval > 0 and time.monotonic() - self._last_pass >= interval:
            self.run(self.actor)

    def flush(self) -> None:
        """Write this replica's recorded hits to the index now (kept on failure)."""
        try:
            self.access.flush(self.index)
        except StoreError as exc:
            log.warning("cannot write access times (kept for the next try): %s", exc)

    # --- passes

    def lead(self) -> bool:
        """Hold (take or renew) the evictor lease; False while another replica does."""
        return self.hold_lease(time.time(), max(5.0, 3 * self.idle()))

    def trim_events(self) -> None:
        """Drop telemetry events past their retention. Appends trim too; this pass
        bounds them by age while no client reports."""
        before = time.time() - self.settings.events_retention_seconds
        try:
            self.index.append_events([], self.settings.events_keep, before)
        except StoreError as exc:
            log.warning("cannot trim telemetry events: %s", exc)

    def leader(self) -> str | None:
        """Who holds the evictor lease now, if anyone."""
        lease = self.index.get_lease(SYSTEM, LEADER, time.time())
        return None if lease is None else lease.holder

    def run(self, actor: str) -> Pass | None:
        """One pass, if this replica leads; None when another one does."""
        with self._pass_lock:
            if not self.lead():
                return None
            started = time.monotonic()
            self._last_pass = started
            self.flush()  # plan on the latest access times this replica knows
            done = Pass(plans=self.evictor.plan())
            victims = [v for plan in done.plans for v in plan.victims]
            # Renewed between the steps: a long pass keeps its lease (another replica
            # would otherwise start a second pass beside it); lost, the pass stops.
            if self.lead():
                done.applied = self.evictor.apply(victims, actor)
            if self.lead():
                # Only over an index that names every documented entry: else a blob
                # it lost the row of would look unreferenced.
                if self.recovery.reconciled(self.lead):
                    done.collected = self.evictor.collect_blobs(self.lead)
                else:
                    done.paused = True
            self.trim_events()
            done.seconds = time.monotonic() - started
        if done.applied.removed or done.collected.blobs:
            log.info(
                "eviction: %d entries (%d bytes) removed, %d blobs (%d bytes) collected in %.2f s",
                len(done.applied.removed),
                done.applied.bytes,
                done.collected.blobs,
                done.collected.bytes,
                done.seconds,
            )
        return done
