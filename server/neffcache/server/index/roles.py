"""The index's roles, one small protocol each, and ``Index``, the whole that a backend
implements and the server calls.

Every method is safe to call from several threads; misses return None. The contract
tests in tests/contract/ run each role's protocol against every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .base import (
    AuditRecord,
    Entry,
    EntryStats,
    Event,
    Failure,
    Lease,
    PutResult,
    Record,
    Token,
    Touch,
)


class Entries(Protocol):
    """Entries and their aliases: the published manifests a lookup answers
    from, and the facts and use eviction reads (``EntryStats``). Entries are immutable;
    only ``delete_entry`` removes one, with its aliases."""

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        """Create the entry if its (namespace, key) is free, and its aliases with it,
        and its facts (``entry_facts(entry.manifest)``) with ``last_access`` =
        ``created_at`` and no hits. On SAME or CONFLICT nothing changes. An alias that
        already names another existing entry keeps its first key; one that names a key
        with no entry (deleted) is free and names the new key."""

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        """The entry, or None."""

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        """The key an alias names in a namespace, or None."""

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        """Every alias naming ``key`` in a namespace, sorted; ``[]`` when none."""

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        """Atomically: make ``alias`` name ``key`` if the entry (namespace, key) exists
        and the alias names nothing yet, or names a key with no entry (CREATED); SAME
        when it names ``key`` already, CONFLICT when it names another existing entry
        (which it keeps). None, and nothing stored, when there is no entry under
        ``key``."""

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        """Up to ``limit`` (>= 1) entries of a namespace whose keys sort after ``after``
        (from the first, for None), in ascending key order; ``[]`` past the last or for
        an empty namespace. Paging by the last key seen never repeats nor skips an
        entry that existed throughout the listing (entries are never rewritten)."""

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        """As ``list_entries``, the entries' stats instead of their manifests."""

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        """For each touch of an existing entry: ``last_access`` becomes the later of
        itself and ``at``, and ``hits`` grows by ``hits``. Touches of absent entries
        are ignored (never create anything). Not atomic as a batch; each touch is."""

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        """Remove the entry, its stats and every alias naming its key, atomically, if
        its ``created_at`` is ``created_at`` (so a stale plan never removes an entry
        published again since); False, and nothing changed, otherwise."""

    def namespaces(self) -> list[str]:
        """Every namespace holding an entry, sorted; it may also list namespaces whose
        entries were all deleted."""


class Failures(Protocol):
    """Failure records: many per key, short-lived, never a cache hit."""

    def put_failure(self, failure: Failure, keep: int) -> None:
        """Add a failure record, then drop the records of its (namespace, key) that
        expired by ``failure.created_at`` and all but the ``keep`` longest-lived (latest
        ``expires_at``; with one TTL setting, the newest). Atomic: concurrent writers
        never leave more than ``keep`` records of one key. Expired
        records of other keys are reclaimed here too (or by the backend's own expiry),
        so storage holds only live records and stays bounded."""

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        """The records of (namespace, key) with ``expires_at > now``, newest first
        (records created at the same instant in any order); ``[]`` when none."""


class Leases(Protocol):
    """Compile leases: one holder of (namespace, name) at a time, across replicas."""

    def acquire_lease(self, lease: Lease, replacing: str | None = None) -> Lease:
        """Atomically: store ``lease`` if its (namespace, name) has no lease live at
        ``lease.acquired_at`` (``expires_at`` later than it), or if the live one's
        ``lease_id`` is ``replacing`` (a holder known dead, a failure notice older
        than the asker's wait), and return it; else return the live lease, unchanged
        (the caller compares ``lease_id``)."""

    def renew_lease(self, namespace: str, name: str, lease_id: str, expires_at: float) -> bool:
        """Move the expiry of the lease ``lease_id`` holds; False when it holds none
        (released, taken over after expiring, or a failure notice). A lease that
        expired but was not taken over may or may not be renewed."""

    def release_lease(
        self, namespace: str, name: str, lease_id: str, failed_until: float | None
    ) -> bool:
        """End the lease ``lease_id`` holds; with ``failed_until``, leave a failure
        notice (``failed`` set, no holder rights) in its place until then. False when
        ``lease_id`` holds nothing, in which case nothing changes."""

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        """The lease of (namespace, name) live at ``now``, or None."""


class Tokens(Protocol):
    """API tokens, by id and by the hash of their secret; never deleted."""

    def put_token(self, token: Token) -> None:
        """Store a new token (token_id and secret_hash are unique)."""

    def token_by_hash(self, secret_hash: str) -> Token | None:
        """The token with this secret hash, revoked or not, or None."""

    def tokens(self) -> list[Token]:
        """Every token, revoked ones included, oldest first."""

    def revoke_token(self, token_id: str) -> bool:
        """Mark a token revoked; False if there is no such token."""


class Records(Protocol):
    """Small named JSON documents: namespace policies and pins."""

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        """Store (replace) a record; with ``create_only``, only if none of its kind,
        namespace and name exists; with ``replacing``, only if the stored value is
        exactly that (compare-and-set: two admins' changes never silently merge).
        True when stored."""

    def get_record(self, kind: str, namespace: str, name: str) -> Record | None:
        """The record, or None."""

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        """Remove a record; False if there was none."""

    def records(self, kind: str, namespace: str | None = None) -> list[Record]:
        """The records of a kind (of one namespace, or of all), ordered by namespace
        then name."""


class AuditLog(Protocol):
    """The audit log: who did what, bounded by count."""

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        """Append records, then drop all but the ``keep`` newest of the whole log."""

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        """Up to ``limit`` records with ``at >= since`` (of one namespace, or all),
        newest first; records of one instant in reverse order of appending."""


class EventLog(Protocol):
    """Clients' telemetry events: a log bounded by count, by age and by bytes
    per namespace, read in time order by reports and per key by explanations."""

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        """Append events, then drop every event with ``at < before`` and all but the
        ``keep`` newest (by ``at``, then order of appending), so storage stays bounded;
        with no events, only trims. With ``max_bytes``, then drop the oldest events of
        each namespace of ``events`` until its ``events_bytes`` is at most
        ``max_bytes`` (other namespaces are not looked at: no scan per append). Readers
        may see part of a batch before the rest; no event is ever half-stored."""

    def events_bytes(self, namespace: str) -> int:
        """The bytes (``event_size``) of a namespace's stored events, 0 for none: a
        running total the backend keeps as events come and go, never a scan."""

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        """Up to ``limit`` (>= 1) events with ``since <= at < until`` (of these
        namespaces, or of all for None), oldest first (by ``at``, then order of
        appending), resuming after the opaque cursor ``after`` (None: from the
        first); and the cursor of the next page, None when this page was the last.
        Paging never repeats an event, nor skips one that existed throughout the
        listing. A cursor this backend did not hand out, or a ``limit`` below 1,
        raises ValueError."""

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        """The newest ``limit`` events of (namespace, key) still in the log, newest
        first; ``[]`` when none, and for the key ``""`` (events without a key). A
        backend may keep fewer per key: Redis keeps each key's newest 100."""


class Index(Entries, Failures, Leases, Tokens, Records, AuditLog, EventLog, Protocol):
    """Every role, and the backend's life. An implementation may set a class attribute
    ``local = True`` when it answers from this machine's disk or memory; the server
    then calls it on its event loop instead of a worker thread. Without it, calls go
    to worker threads."""

    def check(self) -> None:
        """Raise StoreError if the backend cannot be reached (readiness)."""

    def close(self) -> None:
        """Release connections."""
