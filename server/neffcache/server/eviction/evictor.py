"""Applying eviction: remove planned entries (with an audit record each), retire
compiler versions on request, and collect blobs no entry references.

Blobs are shared by every namespace and outlive their last entry by at least
``blob_grace_seconds``: a blob is removed only once it was found unreferenced by two
collections that far apart, and was neither stored, nor read or probed on this
replica (``BlobUse``), within that time. So an upload whose manifest is not yet
published survives, and a download that began before its entry was evicted completes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.server.audit import AuditLog, record
from neffcache.server.auth import ANONYMOUS
from neffcache.server.blobs import BlobInfo, BlobStore
from neffcache.server.blobuse import BlobUse
from neffcache.server.eviction.pins import Pinned, version_matches
from neffcache.server.eviction.plan import Plan, Victim, plan_namespace
from neffcache.server.index import AuditRecord, EntryStats, Index, Record
from neffcache.server.namespaces import Policies
from neffcache.server.settings import ServerSettings

log = logging.getLogger("neffcache.server.eviction")

_PAGE = 1000
# Index records (namespace "") of blobs being removed (see Evictor._remove).
CONDEMNED = "condemned"


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
    ) -> None:
        self.index = index
        self.blobs = blobs
        self.policies = policies
        self.audit = audit
        self.settings = settings
        self.blob_use = blob_use
        self.clock = clock
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
            finally:
                # Also when a store error ends the loop: every removal made is audited.
                self.audit.write(records)
        return applied

    def collect_blobs(self) -> Collected:
        """Remove blobs no entry references, after their grace (module docstring)."""
        now = self.clock()
        grace = self.settings.blob_grace_seconds
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
            if (
                now - first < grace
                or now - blob.modified < grace
                or self.blob_use.used_within(blob.digest, grace)
            ):
                collected.waiting += 1
            else:
                due.append(blob)
        if due:
            self._remove(due, collected, orphans)
        self._orphans = orphans
        return collected

    def _remove(self, due: list[BlobInfo], collected: Collected, orphans: dict[str, float]) -> None:
        """Remove blobs found unreferenced, safely against publishes that reference
        them meanwhile (through any replica, over a blob the publisher found present):

        1. each is marked condemned in the index, then
        2. references are read again: a blob referenced now is kept, then
        3. the rest are removed, and the marks cleared.

        A publish checks its blobs after publishing (api/entries.py): a blob missing
        or condemned then makes it take its entry back and ask for the blob. A publish
        before step 2 is seen by it; one after step 2 comes after step 1, so it sees
        the mark until step 3 ends, or the blob gone after. No entry is ever left
        naming a blob removed under it.
        """
        now = repr(self.clock())
        marked = []
        try:
            for blob in due:
                self.index.put_record(Record(CONDEMNED, "", blob.digest, now))
                marked.append(blob.digest)
            referenced = self._referenced()
            grace = self.settings.blob_grace_seconds
            for blob in due:
                orphans.pop(blob.digest, None)
                if blob.digest in referenced or self.blob_use.used_within(blob.digest, grace):
                    continue
                if self.blobs.delete(blob.digest):
                    collected.blobs += 1
                    collected.bytes += blob.size
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
        trusted = {t.token_id for t in self.index.tokens() if t.trusted or t.scope == "admin"}
        trusted.add(ANONYMOUS)  # protected mode: the host's own admin
        return trusted

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
