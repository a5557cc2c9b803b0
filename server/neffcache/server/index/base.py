"""The index interface: entries (manifests) per namespace, their aliases, tokens,
failure records, and compile leases.

Entries are immutable: ``put_entry`` is an atomic create-if-absent, so of two
concurrent writers of one key exactly one wins and every reader sees only the winner.
Failure records are the opposite: many per key, short-lived, never a cache hit, and
kept apart from entries so that no failure can change what a lookup answers.
Leases are the shortest-lived: who compiles a missing graph right now, so that a fleet
starting cold compiles it once; they live in the index so that every replica agrees.

For eviction the index also keeps, per entry, the facts a manifest implies (size,
compile time, compiler version, model, the blobs it references: ``EntryFacts``) and
when the server last served it (``touch_entries``); namespace policies and pins as
small records (``put_record``); and an audit log. Entries are removed only by
``delete_entry``, which takes their aliases with them. Telemetry events from clients
(``append_events``) form a second log, bounded by count, by age and by bytes per
namespace, read in time order by reports and per key by explanations.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from neffcache.protocol import Manifest, ManifestError, parse


class PutResult(enum.Enum):
    CREATED = "created"  # stored now
    SAME = "same"  # an identical manifest was already there
    CONFLICT = "conflict"  # a different manifest holds the key


@dataclass(frozen=True)
class Entry:
    namespace: str
    key: str
    manifest: str  # canonical JSON (sorted keys, no spaces), as the API stored it
    created_at: float  # server clock, seconds since the epoch
    writer: str  # id of the token that published it ("anonymous" without tokens)


@dataclass(frozen=True)
class Failure:
    """One reported failed compile of a key."""

    namespace: str
    key: str
    record: str  # canonical JSON of the whole record, stamps included, as the API returns it
    created_at: float  # server clock; orders the records of a key
    expires_at: float  # server clock; fixed when written, so a later TTL change spares it


@dataclass(frozen=True)
class Lease:
    """The right to compile ``name`` (a key or a Neuron address) in a namespace, until
    ``expires_at`` unless renewed. A released failed compile leaves a lease with
    ``failed`` set until its ``expires_at``: a notice to those who waited, held by no one.
    """

    namespace: str
    name: str
    lease_id: str  # known only to the holder: renewing and releasing need it
    holder: str  # who holds it (host and pid), for people reading it
    acquired_at: float  # server clock
    expires_at: float  # server clock
    expected_seconds: float | None = None  # the holder's estimate of its compile time
    failed: bool = False


@dataclass(frozen=True)
class Token:
    token_id: str  # short public id, for listing and revoking
    secret_hash: str  # BLAKE3 of the secret; the secret itself is never stored
    scope: str  # "read", "write" or "admin"
    namespaces: tuple[str, ...]  # namespaces it applies to; ("*",) for all
    name: str  # who or what it is for
    created_at: float
    revoked: bool = False
    # May publish into namespaces that take only trusted writers (CI's token, say).
    trusted: bool = False


@dataclass(frozen=True)
class EntryFacts:
    """What eviction needs to know of an entry, read from its manifest once, at
    publish (``entry_facts``); stored beside the entry by every backend."""

    size: int  # bytes of all its files
    compile_seconds: float | None  # as the publisher measured it; None when unknown
    compiler_version: str  # "" when the manifest does not say
    model: str  # the publisher's model label, "" when unset
    digests: tuple[str, ...]  # the blobs it references, sorted, each once


def entry_facts(manifest: str) -> EntryFacts:
    """The facts of a stored (canonical JSON, already validated) manifest. Tolerant:
    a field of the wrong type reads as unknown, so old rows can be backfilled."""
    try:
        raw = json.loads(manifest)
    except ValueError:
        raw = {}
    try:
        return _facts(parse(raw))
    except ManifestError:
        pass  # a row from before a rule: each field read for what it is worth
    if not isinstance(raw, dict):
        raw = {}
    files = raw.get("files")
    refs = [f for f in files.values() if isinstance(f, dict)] if isinstance(files, dict) else []
    size = sum(f["size"] for f in refs if isinstance(f.get("size"), int))
    digests = sorted({f["digest"] for f in refs if isinstance(f.get("digest"), str)})
    seconds = raw.get("compile_seconds")
    components = raw.get("components")
    version = components.get("compiler_version") if isinstance(components, dict) else None
    model = raw.get("model")
    return EntryFacts(
        size=size,
        compile_seconds=float(seconds)
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        else None,
        compiler_version=version if isinstance(version, str) else "",
        model=model if isinstance(model, str) else "",
        digests=tuple(digests),
    )


def _facts(manifest: Manifest) -> EntryFacts:
    version = manifest.components.get("compiler_version")
    return EntryFacts(
        size=sum(ref.size for ref in manifest.files.values()),
        compile_seconds=None
        if manifest.compile_seconds is None
        else float(manifest.compile_seconds),
        compiler_version=version if isinstance(version, str) else "",
        model=manifest.model or "",
        digests=tuple(sorted({ref.digest for ref in manifest.files.values()})),
    )


@dataclass(frozen=True)
class EntryStats:
    """An entry as eviction sees it: its facts and its use, on the server's clock."""

    namespace: str
    key: str
    created_at: float
    writer: str
    facts: EntryFacts
    last_access: float  # the latest touch, or created_at before the first
    hits: int  # touches counted since it was published


@dataclass(frozen=True)
class Touch:
    """``hits`` lookups served from an entry, the last at ``at`` (server clock)."""

    namespace: str
    key: str
    at: float
    hits: int


@dataclass(frozen=True)
class Record:
    """A small named JSON document of a namespace: a policy (kind ``policy``, name
    ``""``) or a pin (kind ``pin``); the index stores the value as given."""

    kind: str
    namespace: str
    name: str
    value: str


@dataclass(frozen=True)
class AuditRecord:
    """Who did what, when and why: one line of the audit log."""

    at: float  # server clock
    actor: str  # a token's id and name, or the server's own job ("evictor@host")
    action: str  # "evict", "expire", "pin", "unpin", "namespace.create", ...
    namespace: str  # "" for a server-wide action
    target: str  # the key, pin or setting acted on; "" when none
    detail: str  # canonical JSON: the reason, bytes, compile seconds, old and new values

    def as_json(self) -> dict[str, Any]:
        detail: Any = json.loads(self.detail) if self.detail else {}
        return {
            "at": self.at,
            "actor": self.actor,
            "action": self.action,
            "namespace": self.namespace,
            "target": self.target,
            "detail": detail,
        }


@dataclass(frozen=True)
class Event:
    """One telemetry event a client reported (``POST /v1/events``), as stored."""

    at: float  # server clock at receipt; orders the log
    namespace: str
    kind: str  # "graph" | "counters"
    key: str  # the graph's key; "" when none
    body: str  # canonical JSON of the whole stored event, both stamps included


def event_size(event: Event) -> int:
    """The bytes an event counts toward its namespace's bound (``append_events``'s
    ``max_bytes``): its body, in UTF-8. The body holds every field, the namespace and
    key included; what a backend adds per event (row, indexes, copies) is not counted
    and docs/telemetry.md states it."""
    return len(event.body.encode())


def event_cursor(at: float, seq: int) -> str:
    """The cursor ``Index.events`` hands out: the last event's place in the log, its
    time then the backend's sequence for the order of appending."""
    return f"{at!r}/{seq}"  # repr round-trips the float exactly


def event_place(cursor: str) -> tuple[float, int]:
    """The place a cursor names; ValueError for anything ``event_cursor`` did not make."""
    at, sep, seq = cursor.partition("/")
    if not sep:
        raise ValueError(f"not an events cursor: {cursor!r}")
    return float(at), int(seq)


def events_start(since: float, after: str | None, limit: int) -> tuple[float, int]:
    """Where a page of ``Index.events`` starts: just after the cursor, never before
    ``since`` (sequences start at 1, so ``(since, 0)`` takes every event at ``since``).
    ValueError for a page of fewer than 1 event, or a cursor ``event_cursor`` did not
    make: the checks every backend makes before reading."""
    if limit < 1:
        raise ValueError(f"an events page holds at least 1 event, not {limit}")
    return (since, 0) if after is None else max((since, 0), event_place(after))


class Index(Protocol):
    """An implementation may set a class attribute ``local = True`` when it answers
    from this machine's disk or memory; the server then calls it on its event loop
    instead of a worker thread. Without it, calls go to worker threads.

    Every method is safe to call from several threads; misses return None."""

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

    def put_failure(self, failure: Failure, keep: int) -> None:
        """Add a failure record, then drop the records of its (namespace, key) that
        expired by ``failure.created_at`` and all but the ``keep`` newest. Atomic:
        concurrent writers never leave more than ``keep`` records of one key. Expired
        records of other keys are reclaimed here too (or by the backend's own expiry),
        so storage holds only live records and stays bounded."""

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        """The records of (namespace, key) with ``expires_at > now``, newest first
        (records created at the same instant in any order); ``[]`` when none."""

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

    def put_token(self, token: Token) -> None:
        """Store a new token (token_id and secret_hash are unique)."""

    def token_by_hash(self, secret_hash: str) -> Token | None:
        """The token with this secret hash, revoked or not, or None."""

    def tokens(self) -> list[Token]:
        """Every token, revoked ones included, oldest first."""

    def revoke_token(self, token_id: str) -> bool:
        """Mark a token revoked; False if there is no such token."""

    def check(self) -> None:
        """Raise StoreError if the backend cannot be reached (readiness)."""

    def close(self) -> None:
        """Release connections."""

    # --- listing

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        """Up to ``limit`` (>= 1) entries of a namespace whose keys sort after ``after``
        (from the first, for None), in ascending key order; ``[]`` past the last or for
        an empty namespace. Paging by the last key seen never repeats nor skips an
        entry that existed throughout the listing (entries are never rewritten)."""

    # --- eviction

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

    # --- records: namespace policies and pins

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

    # --- audit log

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        """Append records, then drop all but the ``keep`` newest of the whole log."""

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        """Up to ``limit`` records with ``at >= since`` (of one namespace, or all),
        newest first; records of one instant in reverse order of appending."""

    # --- telemetry events

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
