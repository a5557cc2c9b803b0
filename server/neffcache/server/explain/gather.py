"""The inputs of an explanation, read from the index (``gather``) and, for the shapes
of the closest other graph, from the blob store (``fill_shapes``).

Every read is bounded: a few events and failure records of the key, a bounded slice of
the audit log, at most ``NAMESPACES_SCANNED`` namespaces looked into, the program map's
records (each a list of at most 32), and presence checks for the nearest variants only.
Nothing here records a hit: asking why a graph missed is not a use of its entry.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from neffcache.server.auth import Caller
from neffcache.server.blobs import BlobStore
from neffcache.server.explain import notes
from neffcache.server.explain.engine import as_of_miss, rank
from neffcache.server.explain.facts import (
    Asked,
    FailureSeen,
    Inputs,
    OtherGraph,
    Policy,
    Present,
    Removal,
    Variant,
)
from neffcache.server.explain.hlo import hlo_digest, summary_of_blob
from neffcache.server.explain.request import stored_components
from neffcache.server.index import Index
from neffcache.server.index.base import Event
from neffcache.server.services import Services

EVENTS_READ = 16  # newest events of the key
AUDIT_READ = 2000  # newest audit records of the asked namespace searched for the key
SOURCE_AUDIT_READ = 500  # ... of each namespace it reads through
NAMESPACES_SCANNED = 32  # namespaces looked into for the same key
PROGRAM_NAMESPACES = 16  # other namespaces whose program map is read
PRESENCE_CHECKED = 8  # nearest variants whose entry is looked up
GRAPH_CANDIDATES = 3  # other graphs of the same structure considered
REMOVALS = ("evict", "expire")
T = TypeVar("T")


@dataclass
class Gathered:
    inputs: Inputs
    # Fingerprint of a candidate graph -> the blob digest of one of its entries' HLO.
    hlo: dict[str, str] = field(default_factory=dict)


def asked_for_key(index: Index, namespace: str, key: str, now: float) -> Asked:
    """What the server knows of a key a client asked about: the components and graph
    of its newest miss event, else of its newest failure record."""
    components: dict[str, Any] = {}
    graph = None
    model = None
    missed_at = None
    for event, body in _events(index, namespace, key):
        if missed_at is None and body.get("result") == "miss":
            missed_at = _looked_up(event, body)
        if not components:
            components, graph = stored_components(body.get("components"))
            if components and isinstance(body.get("model"), str):
                model = body["model"]
    if not components:
        for failure in index.failures(namespace, key, now)[:1]:
            components, graph = stored_components(_json(failure.record).get("components"))
    return Asked(namespace, key, components, graph, model, missed_at)


def _looked_up(event: Event, body: Mapping[str, Any]) -> float:
    """When a reported miss was looked up: a client makes a graph's event after its
    compile (and publishes the graph then), and sends it up to a second or so later,
    so the receipt is later by the compile and that wait. The client's own stamp
    (``client_at``) leaves out the wait, when its clock is not ahead of ours."""
    made, seconds = _number(body.get("client_at")), _number(body.get("compile_seconds"))
    at = made if made is not None and 0 < made < event.at else event.at
    return at - seconds if seconds is not None and seconds > 0 else at


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _events(index: Index, namespace: str, key: str) -> list[tuple[Event, dict[str, Any]]]:
    """The key's newest graph events, newest first, with their bodies."""
    found = []
    for event in index.events_for_key(namespace, key, EVENTS_READ):
        body = _json(event.body)
        if event.kind == "graph" and body:
            found.append((event, body))
    return found


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def gather(backends: Services, caller: Caller, asked: Asked, now: float) -> Gathered:
    index = backends.index
    ns, key = asked.namespace, asked.key
    reads = [ns, *backends.policies.sources(ns)]  # what a lookup in ns reads, in order
    inputs = Inputs(asked, now, _policy(backends, ns))
    if key is not None:
        entry = _present(index, reads, key)
        removals = _removals(index, reads, key)
        inputs = replace(
            inputs, entry=entry, removals=removals, failure=_failure(index, ns, key, now)
        )
        if entry is None:
            inputs = replace(inputs, elsewhere=_elsewhere(index, caller, reads, key))
    fingerprint = asked.components.get("fingerprint")
    if not isinstance(fingerprint, str):
        return Gathered(inputs)
    searched = reads + _readable_others(index, caller, reads)[:PROGRAM_NAMESPACES]
    found = [v for n in searched for v in notes.variants(index, n, fingerprint)]
    mine = [v for v in found if v.key == key and v.namespace in reads]
    mine.sort(key=lambda v: v.seen != "published")  # had an entry anywhere it is read
    others = _checked(index, asked.components, [v for v in found if v.key != key], ns)
    inputs = replace(inputs, own=mine[0] if mine else None, variants=tuple(others))
    basis = as_of_miss(inputs)  # an entry published after the miss explains nothing
    if (basis or inputs).variants or (inputs.entry is not None and basis is None):
        return Gathered(inputs)
    return _with_graphs(index, inputs, searched, fingerprint)


def _policy(backends: Services, namespace: str) -> Policy:
    policy = backends.policies.get(namespace)
    return Policy(
        namespace,
        policy.ttl_seconds,
        policy.quota_bytes,
        policy.compiler_versions,
        policy.failure_ttl_seconds,
        tuple(policy.read_through),
    )


def _present(index: Index, namespaces: Sequence[str], key: str) -> Present | None:
    for namespace in namespaces:
        entry = index.get_entry(namespace, key)
        if entry is not None:
            manifest = _json(entry.manifest)
            name = _token_name(index, entry.writer)
            return Present(namespace, key, entry.created_at, entry.writer, manifest, name)
    return None


def _token_name(index: Index, token_id: str) -> str:
    """The name of the token that wrote an entry: people know tokens by name."""
    return next((t.name for t in index.tokens() if t.token_id == token_id), "")


def _removals(index: Index, namespaces: Sequence[str], key: str) -> tuple[Removal, ...]:
    found = []
    for i, namespace in enumerate(namespaces):
        limit = AUDIT_READ if i == 0 else SOURCE_AUDIT_READ
        read = partial(_read_removals, index, namespace, limit)
        removed = _RECENT.get(index, ("audit", namespace, limit), read)
        found += removed.get(key, [])
    found.sort(key=lambda r: r.at, reverse=True)
    return tuple(found)


def _read_removals(index: Index, namespace: str, limit: int) -> dict[str, list[Removal]]:
    """The removals among a namespace's newest audit records, by key."""
    by_key: dict[str, list[Removal]] = {}
    for record in index.audit(0.0, namespace, limit):
        if record.action in REMOVALS and record.target:
            removal = Removal(
                record.at, namespace, record.action, record.actor, _json(record.detail)
            )
            by_key.setdefault(record.target, []).append(removal)
    return by_key


def _namespaces(index: Index) -> list[str]:
    return _RECENT.get(index, ("namespaces",), lambda: index.namespaces()[:NAMESPACES_SCANNED])


class _Recent:
    """Index answers every explanation needs and few change: the audit log's removals
    and the list of namespaces, kept for ``RECENT_SECONDS`` per index object. Misses
    come in bursts (a fleet starting cold asks for each graph it compiles), and the
    audit log is the largest read; a removal is seen at most that much later."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._lock = threading.Lock()
        self._kept: weakref.WeakKeyDictionary[Index, dict[Hashable, tuple[float, Any]]]
        self._kept = weakref.WeakKeyDictionary()

    def get(self, index: Index, what: Hashable, read: Callable[[], T]) -> T:
        now = time.monotonic()
        try:
            with self._lock:
                kept = self._kept.setdefault(index, {})
                found = kept.get(what)
        except TypeError:  # an index that takes no weak reference: not kept
            return read()
        if found is not None and now - found[0] < self._seconds:
            value: T = found[1]
            return value
        value = read()
        with self._lock:
            if len(kept) > 1024:  # namespaces nobody asks about again
                kept.clear()
            kept[what] = (now, value)
        return value


RECENT_SECONDS = 5.0
_RECENT = _Recent(RECENT_SECONDS)


def _failure(index: Index, namespace: str, key: str, now: float) -> FailureSeen | None:
    """The newest failure record, unless a client reported a successful compile of
    the key since; else a failed compile the key's newest compile event reported
    (clients without a write token report failures only so)."""
    outcome = None
    for event, body in _events(index, namespace, key):
        if body.get("outcome") in ("ok", "failed"):
            outcome = (event, body)
            break
    records = index.failures(namespace, key, now)
    if records:
        newer_ok = outcome is not None and outcome[1]["outcome"] == "ok"
        if newer_ok and outcome is not None and outcome[0].at > records[0].created_at:
            return None
        return FailureSeen(records[0].created_at, _json(records[0].record), "record")
    if outcome is not None and outcome[1]["outcome"] == "failed":
        kept = ("host", "job_id", "compile_seconds", "compiler_version", "instance_type")
        return FailureSeen(
            outcome[0].at, {k: outcome[1][k] for k in kept if k in outcome[1]}, "event"
        )
    return None


def _readable_others(index: Index, caller: Caller, skip: Sequence[str]) -> list[str]:
    """Up to ``NAMESPACES_SCANNED`` namespaces besides ``skip`` that the caller may
    read: those its token names, or for a token of every namespace (and protected
    mode) the first the index lists. Nothing of another namespace is looked at, not
    even whether it holds a key: a token learns nothing of what it cannot read."""
    every = "*" in caller.namespaces
    names = _namespaces(index) if every else sorted(set(caller.namespaces))
    return [n for n in names if n not in skip and caller.covers(n)][:NAMESPACES_SCANNED]


def _elsewhere(index: Index, caller: Caller, skip: Sequence[str], key: str) -> tuple[str, ...]:
    """Namespaces not read through, readable by the caller, that hold the key."""
    names = _readable_others(index, caller, skip)
    return tuple(n for n in names if index.get_entry(n, key) is not None)


def _checked(
    index: Index, components: Mapping[str, Any], found: list[Variant], home: str
) -> list[Variant]:
    """Variants nearest first, the nearest ones with whether their entry exists, and
    ranked again with that known (an entry that exists is the better comparison)."""
    ranked = rank(components, found, home)
    for i, variant in enumerate(ranked[:PRESENCE_CHECKED]):
        present = index.get_entry(variant.namespace, variant.key) is not None
        ranked[i] = replace(variant, present=present)
    return rank(components, ranked, home)


def _with_graphs(
    index: Index, inputs: Inputs, searched: Sequence[str], fingerprint: str
) -> Gathered:
    """The closest other programs: the same structure (newest first, those whose HLO
    can be read first), else the newest of the same model."""
    asked = inputs.asked
    candidates: list[tuple[float, str, str, Any, str]] = []
    if asked.graph is not None:
        for namespace in searched:
            for item in notes.items(index, notes.STRUCTURE, namespace, asked.graph.structure):
                candidates.append(_candidate(item, namespace, "structure"))
    if asked.model:
        for namespace in searched:
            # The newest other program of the model: the newest item is often the asked
            # graph itself (its own miss noted it).
            noted = notes.items(index, notes.MODEL, namespace, asked.model)
            latest = [c for c in (_candidate(i, namespace, "model") for i in noted) if c[2]]
            candidates += [c for c in latest if c[2] != fingerprint][:1]
    candidates = [c for c in candidates if c[2] != fingerprint and c[2]]
    candidates.sort(key=lambda c: (c[4] != "structure", -c[0]))
    graphs, hlo = [], {}
    for _, namespace, other, count, relation in candidates[:GRAPH_CANDIDATES]:
        found = notes.variants(index, namespace, other)
        variants = _checked(index, asked.components, found, asked.namespace)
        digest = _hlo_of(index, variants)
        if digest is not None:
            hlo[other] = digest
        model = (asked.model or "") if relation == "model" else ""
        graphs.append(OtherGraph(namespace, other, relation, count, None, tuple(variants), model))
    graphs.sort(key=lambda g: (g.relation != "structure", g.fingerprint not in hlo))
    # Only the first is compared (engine._graph): the others' modules are not read.
    first = graphs[0].fingerprint if graphs else ""
    used = {first: hlo[first]} if first in hlo else {}
    return Gathered(replace(inputs, graphs=tuple(graphs)), used)


def _candidate(
    item: Mapping[str, Any], namespace: str, relation: str
) -> tuple[float, str, str, Any, str]:
    at = item.get("at")
    fingerprint = item.get("fingerprint")
    count = item.get("instructions")
    return (
        float(at) if isinstance(at, (int, float)) else 0.0,
        namespace,
        fingerprint if isinstance(fingerprint, str) else "",
        count if isinstance(count, int) and not isinstance(count, bool) else None,
        relation,
    )


def _hlo_of(index: Index, variants: Sequence[Variant]) -> str | None:
    for variant in variants:
        if variant.present:
            entry = index.get_entry(variant.namespace, variant.key)
            digest = hlo_digest(_json(entry.manifest)) if entry is not None else None
            if digest is not None:
                return digest
    return None


def fill_shapes(gathered: Gathered, blobs: BlobStore) -> Inputs:
    """The inputs with each candidate graph's shapes, read from its stored HLO."""
    graphs = []
    for graph in gathered.inputs.graphs:
        digest = gathered.hlo.get(graph.fingerprint)
        summary = summary_of_blob(blobs, digest) if digest is not None else None
        graphs.append(replace(graph, shapes=summary.shapes) if summary is not None else graph)
    return replace(gathered.inputs, graphs=tuple(graphs))
