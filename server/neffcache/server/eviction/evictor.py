"""Applying eviction: remove planned entries (with an audit record each), retire
compiler versions on request, and collect blobs no entry references.

Blobs are shared by every namespace and outlive their last entry by at least
``blob_grace_seconds``: a blob is removed only once it was found unreferenced by two
collections that far apart, and was not stored within that time. So an upload whose
manifest is not yet published survives its grace. A read on this replica (``BlobUse``:
a download touches its blob with every chunk) keeps it a while longer, but only while
it is read (``IN_USE_S``, or the grace when shorter), so a download that began before
its entry was evicted completes, and reading a blob nobody publishes cannot keep it
forever. Asking ``/v1/blobs/missing`` about a blob renews nothing (api/blobs.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.server.audit import AuditLog, record
from neffcache.server.auth import trusted_writer_ids
from neffcache.server.blobs import BlobInfo, BlobStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.eviction.pins import Pinned, version_matches
from neffcache.server.eviction.plan import Plan, Victim, plan_namespace
from neffcache.server.index import AuditRecord, EntryStats, Index, Record
from neffcache.server.metrics import Metrics
from neffcache.server.namespaces import Policies
from neffcache.server.settings import ServerSettings

log = logging.getLogger("neffcache.server.eviction")

_PAGE = 1000
# Index records (namespace "") of blobs being removed (see Evictor._remove); the value
# is when the mark was made (epoch seconds).
CONDEMNED = "condemned"
# A mark older than this is ignored by publishers and swept: one left by an evictor
# that died cannot block a blob's publishes for long. The evictor stops removing a
# batch before its marks reach this age, with a margin for replicas' clock skew.
MARK_TTL_S = 600.0
_MARK_MARGIN_S = 120.0
# How long after its last read on this replica an unreferenced blob is still in use:
# far longer than any pause between a download's chunks, or between a redirect and
# the client's request to the store it names.
IN_USE_S = 600.0


def condemned(index: Index, digest: str, now: float | None = None) -> bool:
    """Whether an evictor is deciding about this blob now (a live mark)."""
    mark = index.get_record(CONDEMNED, "", digest)
    if mark is None:
        return False
    try:
        made = float(mark.value)
    except ValueError:
        return False
    return (time.time() if now is None else now) - made < MARK_TTL_S


@dataclass
class Applied:
    """What a removal did, for the API and the logs."""

    removed: list[Victim] = field(default_factory=list)
    # Planned but kept: pinned meanwhile, republished, or already gone.
    skipped: int = 0

    @property
    def bytes(self) -> int:
        return sum(v.stats.facts.size for v in self.removed)


@dataclass
class Usage:
    namespace: str
    entries: int = 0
    bytes: int = 0
    compile_seconds: float = 0.0


@dataclass
class Collected:
    blobs: int = 0
    bytes: int = 0
    waiting: int = 0  # unreferenced, within their grace period


class Evictor:
    def __init__(
        self,
        index: Index,
        blobs: BlobStore,
        policies: Policies,
        audit: AuditLog,
        settings: ServerSettings,
        blob_use: BlobUse,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.index = index
        self.blobs = blobs
        self.policies = policies
        self.audit = audit
        self.settings = settings
        self.blob_use = blob_use
        self.clock = clock
        self.metrics = metrics
        # Digest -> when a collection first found it unreferenced (this process's view).
        self._orphans: dict[str, float] = {}

    # --- reading

    def stats(self, namespace: str) -> Iterator[EntryStats]:
        after = None
        while True:
            page = self.index.entry_stats(namespace, after, _PAGE)
            if not page:
                # Only an empty page ends the listing: a page is short also when
                # entries were deleted while it was read.
                return
            yield from page
            after = page[-1].key

    def usage(self, namespace: str) -> Usage:
        """What a namespace holds now: entries, bytes, known compile seconds."""
        held = Usage(namespace)
        for entry in self.stats(namespace):
            held.entries += 1
            held.bytes += entry.facts.size
            held.compile_seconds += entry.facts.compile_seconds or 0.0
        return held

    def plan(self, namespaces: Sequence[str] | None = None) -> list[Plan]:
        """What the rules would remove now, per namespace (nothing is changed)."""
        names = self.index.namespaces() if namespaces is None else namespaces
        now = self.clock()
        plans = []
        for namespace in names:
            entries = list(self.stats(namespace))
            policy = self.policies.get(namespace)
            pinned = self.pinned(namespace)
            half_life = self.settings.value_half_life_seconds
            plans.append(plan_namespace(entries, policy, pinned, now, half_life))
        return plans

    def expiring(self, spec: str, namespaces: Sequence[str] | None = None) -> list[Victim]:
        """Every unpinned entry built by a compiler version matching ``spec``."""
        names = self.index.namespaces() if namespaces is None else namespaces
        victims = []
        for namespace in names:
            pinned = self.pinned(namespace)
            for entry in self.stats(namespace):
                if version_matches(spec, entry.facts.compiler_version) and entry not in pinned:
                    why = f"compiler {entry.facts.compiler_version} retired ({spec})"
                    victims.append(Victim(entry, "admin-expire", why))
        return victims

    # --- changing

    def apply(self, victims: Sequence[Victim], actor: str, action: str = "evict") -> Applied:
        """Remove the victims, each unless it was pinned since it was planned or its
        entry is no longer the one planned; one audit record per removal."""
        applied = Applied()
        by_namespace: dict[str, list[Victim]] = {}
        for victim in victims:
            by_namespace.setdefault(victim.stats.namespace, []).append(victim)
        for namespace, planned in by_namespace.items():
            # Pins read again right before removing: a pin placed while the plan was
            # made still protects its entries (a window of one index read remains).
            pinned = self.pinned(namespace)
            records: list[AuditRecord] = []
            try:
                for victim in planned:
                    entry = victim.stats
                    if entry in pinned or not self.index.delete_entry(
                        namespace, entry.key, entry.created_at
                    ):
                        applied.skipped += 1
                        continue
                    applied.removed.append(victim)
                    records.append(
                        record(actor, action, namespace, entry.key, **victim_detail(victim))
                    )
                    if self.metrics is not None:
                        labels = (self.metrics.namespace(namespace), victim.reason)
                        self.metrics.evictions.labels(*labels).inc()
                        self.metrics.evicted_bytes.labels(*labels).inc(entry.facts.size)
            finally:
                # Also when a store error ends the loop: every removal made is audited.
                self.audit.write(records)
        return applied

    def collect_blobs(self, leading: Callable[[], bool] = lambda: True) -> Collected:
        """Remove blobs no entry references, after their grace (module docstring).
        ``leading`` says whether this replica is still the evictor; asked before
        removals begin and every so often during them."""
        now = self.clock()
        grace = self.settings.blob_grace_seconds
        self._sweep_marks(now)
        # Listed before the references are read: a blob stored after the listing is
        # not considered, and one referenced by an entry published meanwhile is seen.
        listed = list(self.blobs.blobs())
        referenced = self._referenced()
        collected = Collected()
        orphans: dict[str, float] = {}
        due = []
        for blob in listed:
            if blob.digest in referenced:
                continue
            first = self._orphans.get(blob.digest, now)
            orphans[blob.digest] = first
            if now - first < grace or now - blob.modified < grace or self._in_use(blob.digest):
                collected.waiting += 1
            else:
                due.append(blob)
        self._orphans = orphans
        if due:
            self._remove(due, collected, leading)
        return collected

    def _in_use(self, digest: str) -> bool:
        return self.blob_use.used_within(digest, min(self.settings.blob_grace_seconds, IN_USE_S))

    def _sweep_marks(self, now: float) -> None:
        for mark in self.index.records(CONDEMNED):
            try:
                stale = now - float(mark.value) >= MARK_TTL_S
            except ValueError:
                stale = True
            if stale:
                self.index.delete_record(CONDEMNED, "", mark.name)

    def _remove(
        self, due: list[BlobInfo], collected: Collected, leading: Callable[[], bool]
    ) -> None:
        """Remove blobs found unreferenced, safely against publishes that reference
        them meanwhile (through any replica, over a blob the publisher found present):

        1. each is marked condemned in the index, then
        2. references are read again: a blob referenced now is kept, then
        3. each of the rest is removed, and its mark cleared.

        A publish checks its blobs after publishing (services/publish.py): while one is
        condemned it waits, and if the blob is then gone it takes its entry back and
        asks for it. A publish before step 2 is seen by it; one after step 2 comes
        after step 1, so it sees the mark until the blob's step 3 ends, and the blob
        gone after. So no entry is ever left naming a removed blob, as long as a mark
        lives (``MARK_TTL_S``): the removals stop before their marks get that old, or
        when this replica stops being the evictor.
        """
        marked_at = self.clock()
        marked: set[str] = set()
        try:
            for blob in due:
                self.index.put_record(Record(CONDEMNED, "", blob.digest, repr(marked_at)))
                marked.add(blob.digest)
            referenced = self._referenced()
            for blob in due:
                # Checked before every removal (a renewal of the lease: removals are
                # few): a replica that lost the lease stops, so two collections never
                # interleave their removals and marks.
                if self.clock() - marked_at > MARK_TTL_S - _MARK_MARGIN_S or not leading():
                    return  # the next pass takes up the rest
                if blob.digest in referenced or self._in_use(blob.digest):
                    pass
                elif self.blobs.delete(blob.digest):
                    collected.blobs += 1
                    collected.bytes += blob.size
                    if self.metrics is not None:
                        self.metrics.blobs_collected.inc()
                        self.metrics.blob_bytes_collected.inc(blob.size)
                self._orphans.pop(blob.digest, None)
                self.index.delete_record(CONDEMNED, "", blob.digest)
                marked.discard(blob.digest)
        finally:
            for digest in marked:
                self.index.delete_record(CONDEMNED, "", digest)

    def _referenced(self) -> set[str]:
        referenced: set[str] = set()
        for namespace in self.index.namespaces():
            for entry in self.stats(namespace):
                referenced.update(entry.facts.digests)
        return referenced

    def trusted_writers(self) -> set[str]:
        """Token ids whose entries label pins may protect (see ``Pinned``)."""
        return trusted_writer_ids(self.index)

    def pinned(self, namespace: str) -> Pinned:
        return Pinned(self.index, namespace, self.trusted_writers())


def victim_detail(victim: Victim) -> dict[str, Any]:
    """What the audit log and the API say of a removed (or to-be-removed) entry."""
    entry = victim.stats
    return {
        "reason": victim.reason,
        "why": victim.why,
        "bytes": entry.facts.size,
        "compile_seconds": entry.facts.compile_seconds,
        "compiler_version": entry.facts.compiler_version,
        "model": entry.facts.model,
        "last_access": entry.last_access,
        "hits": entry.hits,
    }
