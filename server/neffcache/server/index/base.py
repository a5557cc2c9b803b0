"""What the index stores: entries (manifests) per namespace and the facts eviction
reads from them, failure records, compile leases, tokens, small records (policies,
pins), audit records and telemetry events; and the helpers every backend shares.
The roles over them, and ``Index``, are in ``roles.py``.

Entries are immutable: ``put_entry`` is an atomic create-if-absent, so of two
concurrent writers of one key exactly one wins and every reader sees only the winner.
Failure records are the opposite: many per key, short-lived, never a cache hit, and
kept apart from entries so that no failure can change what a lookup answers.
Leases are the shortest-lived: who compiles a missing graph right now, so that a fleet
starting cold compiles it once; they live in the index so that every replica agrees.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

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
