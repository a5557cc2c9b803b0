"""What an explanation is made from (``Inputs``) and what it says (``Explanation``).

Plain values, so that the engine is a pure function of them: ``gather.py`` reads them
from the index and the blob store, tests build them by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The components of a key an explanation compares, in the order a difference in one
# explains a miss first: a compiler upgrade misses every graph, whatever else changed.
COMPARED = ("compiler_version", "flags", "target", "env", "frameworks")


@dataclass(frozen=True)
class GraphInfo:
    """A graph's summary (``neffcache.keying.graph_summary``)."""

    structure: str
    instructions: int
    shapes: tuple[str, ...] | None  # None when not sent (large graphs) or not readable


@dataclass(frozen=True)
class Asked:
    """The graph an explanation is about."""

    namespace: str
    key: str | None
    # As in a manifest: fingerprint, compiler_version, target, flags (list), env and
    # frameworks (dicts), key_version; each may be missing.
    components: Mapping[str, Any]
    graph: GraphInfo | None = None
    model: str | None = None
    missed_at: float | None = None  # when a client reported the miss, if one did


@dataclass(frozen=True)
class Variant:
    """One key the server saw for a program (the program map), with its components."""

    namespace: str
    key: str
    compiler_version: str
    target: str
    flags: tuple[str, ...]
    env: Mapping[str, str]
    frameworks: Mapping[str, str]
    model: str
    created_at: float
    compile_seconds: float | None
    seen: str  # "published": an entry was stored under it; "missed": a client missed it
    present: bool | None = None  # whether its entry exists now; None: not looked up

    def component(self, name: str) -> Any:
        return getattr(self, name)


@dataclass(frozen=True)
class Present:
    """An entry that exists now, in the asked namespace or one it reads through."""

    namespace: str
    key: str
    created_at: float
    writer: str  # a token id, or "anonymous"
    manifest: Mapping[str, Any]
    writer_name: str = ""  # the writer token's name, when it has one


@dataclass(frozen=True)
class Removal:
    """An ``evict`` or ``expire`` audit record whose target is the key."""

    at: float
    namespace: str
    action: str  # "evict" (the rules, or an admin's pass) or "expire" (a compiler retired)
    actor: str
    detail: Mapping[str, Any]  # reason ("quota", "expired", ...), why, bytes, last_access...


@dataclass(frozen=True)
class FailureSeen:
    """The last compile of the key failed: a failure record, or a client's event."""

    at: float
    record: Mapping[str, Any]  # the failure record (with its log tail), or the event
    via: str  # "record" | "event"


@dataclass(frozen=True)
class OtherGraph:
    """A graph with another fingerprint: the same structure, or the same model."""

    namespace: str
    fingerprint: str
    relation: str  # "structure" | "model"
    instructions: int | None
    shapes: tuple[str, ...] | None  # from its stored HLO; None when unavailable
    variants: tuple[Variant, ...]  # its keys, entries that exist first
    model: str = ""


@dataclass(frozen=True)
class Policy:
    """What explanations say of a namespace's rules (namespaces.NamespacePolicy)."""

    namespace: str
    ttl_seconds: float | None = None
    quota_bytes: int | None = None
    compiler_versions: int | None = None
    failure_ttl_seconds: float | None = None
    read_through: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inputs:
    asked: Asked
    now: float
    policy: Policy
    entry: Present | None = None
    # Namespaces not read through that hold the key: only those the caller may read.
    elsewhere: tuple[str, ...] = ()
    removals: tuple[Removal, ...] = ()  # newest first
    failure: FailureSeen | None = None
    variants: tuple[Variant, ...] = ()  # the same program under other keys
    own: Variant | None = None  # the asked key itself in the program map, if there
    graphs: tuple[OtherGraph, ...] = ()  # closest other programs, best first


@dataclass(frozen=True)
class Difference:
    component: str
    yours: Any
    theirs: Any

    def as_json(self) -> dict[str, Any]:
        return {"component": self.component, "yours": self.yours, "theirs": self.theirs}


@dataclass
class Explanation:
    namespace: str
    key: str | None
    reason: str
    summary: str
    sentences: list[str] = field(default_factory=list)
    entry: dict[str, Any] | None = None
    nearest: list[dict[str, Any]] = field(default_factory=list)
    removed: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "key": self.key,
            "reason": self.reason,
            "summary": self.summary,
            "sentences": self.sentences,
            "entry": self.entry,
            "nearest": self.nearest,
            "removed": self.removed,
            "failure": self.failure,
            "graph": self.graph,
        }
