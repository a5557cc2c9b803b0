"""The program map: which keys the server has seen for a program (fingerprint), which
programs for a structure and for a model label, so an explanation finds the nearest
graphs without scanning entries.

Three kinds of index records, per namespace, each a JSON list, newest first, of at most
``KEEP`` items, written with compare-and-set (two writers never lose each other's item):

``program``    name: fingerprint; items: the variants ``{key, compiler_version, target,
               flags, env, frameworks, model, created_at, compile_seconds, seen}``,
               ``seen`` being ``published`` (an entry was stored) or ``missed``
``structure``  name: structure digest (``graph_summary``); items: ``{fingerprint,
               instructions, at}``
``model``      name: the model label; items: ``{fingerprint, structure, instructions, at}``

They are written when an entry is published (``note_published``, after the answer)
and when clients report misses with components (``note_misses``, called by the events
ingest off its hot path). Both are best-effort: a store error is logged, never raised.
Retention: each list is bounded on write, and ``trim`` drops records not written for
``RETAIN_SECONDS`` and all but the ``RECORDS_KEEP`` newest of each kind and namespace;
note calls run it at most once per ``TRIM_EVERY_SECONDS`` per process.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neffcache.protocol import is_hex64
from neffcache.server.blobs import BlobStore
from neffcache.server.explain.facts import Variant
from neffcache.server.explain.hlo import summary_of_entry
from neffcache.server.explain.request import key_of, normalized
from neffcache.server.index import Index, Record

log = logging.getLogger("neffcache.server.explain")

PROGRAM, STRUCTURE, MODEL = "program", "structure", "model"
KINDS = (PROGRAM, STRUCTURE, MODEL)
KEEP = 32  # items per record
VARIANT_MAX_BYTES = 8 * 1024  # a variant larger than this (huge flags) is not kept
RETAIN_SECONDS = 90 * 86400.0
RECORDS_KEEP = 50_000  # records per kind and namespace
TRIM_EVERY_SECONDS = 3600.0
_ATTEMPTS = 12  # compare-and-set rounds before a note is given up
# Between rounds, a random pause of up to this many seconds, doubling each round: a
# fleet starting cold notes the graphs of one model (one model record) all at once,
# and writers that retry at once collide again (a second or so in all, at worst, off
# every request's path).
_PAUSE = 0.001
_PAUSE_MAX = 0.128
PUBLISH_PARSES = 2  # published HLO modules summarized at once, per process
_parsing = threading.BoundedSemaphore(PUBLISH_PARSES)


@dataclass(frozen=True)
class MissNote:
    namespace: str
    key: str
    components: dict[str, Any]  # as in a manifest, plus the optional "graph" summary
    model: str  # "" when unset
    at: float  # server clock


def note_misses(index: Index, misses: Sequence[MissNote]) -> None:
    """Record the programs and structures of missed graphs (best-effort: a store
    error is logged, never raised)."""
    try:
        maybe_trim(index)
        for miss in misses:
            seen = (miss.namespace, miss.key, miss.components, miss.model, miss.at)
            _note(index, *seen, None, "missed")
    except Exception as exc:  # best-effort by contract: the ingest must never fail on it
        log.warning("program map: %d missed graph(s) not noted (%s)", len(misses), exc)


def note_published(index: Index, blobs: BlobStore, namespace: str, key: str) -> None:
    """Record a just-published entry (best-effort, as ``note_misses``). Its structure
    comes from the HLO module among its files, when it has one."""
    try:
        maybe_trim(index)
        entry = index.get_entry(namespace, key)
        if entry is None:
            return
        manifest = json.loads(entry.manifest)
        components = manifest.get("components")
        if not isinstance(components, dict):
            return
        # Parsed on the server's shared worker threads: at most PUBLISH_PARSES at once,
        # so a burst of publishes (a fleet's cold start) cannot take them all. Past
        # that the entry is noted without its structure (its variant is what matters
        # most; a shape-variant explanation then finds it through its model).
        if _parsing.acquire(blocking=False):
            try:
                summary = summary_of_entry(blobs, manifest)
            finally:
                _parsing.release()
            if summary is not None:
                components = {**components, "graph": summary.as_json(shapes_max=0)}
        model = manifest.get("model") if isinstance(manifest.get("model"), str) else ""
        seconds = manifest.get("compile_seconds")
        _note(index, namespace, key, components, model, entry.created_at, seconds, "published")
    except Exception as exc:  # best-effort by contract: the publish has succeeded
        log.warning("program map: entry %s/%s not noted (%s)", namespace, key, exc)


def _note(
    index: Index,
    namespace: str,
    key: str,
    components: Mapping[str, Any],
    model: str,
    at: float,
    compile_seconds: Any,
    seen: str,
) -> None:
    fingerprint = components.get("fingerprint")
    if not isinstance(fingerprint, str) or not is_hex64(fingerprint):
        return
    components = normalized(components)
    # A variant is a key and what it was made of: components that do not make the key
    # they came with (incomplete, another key version, a client's bug) would show
    # differences that are not there. The graph's structure is noted all the same.
    made = key_of(components) == key
    variant = _variant_item(key, components, model, at, compile_seconds, seen) if made else None
    if variant is not None:
        update(index, PROGRAM, namespace, fingerprint, lambda items: _add_variant(items, variant))
    graph = components.get("graph")
    structure = graph.get("structure") if isinstance(graph, dict) else None
    count = graph.get("instructions") if isinstance(graph, dict) else None
    count = count if isinstance(count, int) and not isinstance(count, bool) else None
    if is_hex64(structure):
        item = {"fingerprint": fingerprint, "instructions": count, "at": at}
        update(
            index, STRUCTURE, namespace, structure, lambda items: _add(items, item, "fingerprint")
        )
    if model:
        item = {"fingerprint": fingerprint, "structure": structure, "instructions": count, "at": at}
        update(index, MODEL, namespace, model, lambda items: _add(items, item, "fingerprint"))


def _variant_item(
    key: str,
    components: Mapping[str, Any],
    model: str,
    at: float,
    compile_seconds: Any,
    seen: str,
) -> dict[str, Any] | None:
    seconds = compile_seconds if isinstance(compile_seconds, (int, float)) else None
    item = {
        "key": key,
        "compiler_version": _text(components.get("compiler_version")),
        "target": _text(components.get("target")),
        "flags": _texts(components.get("flags")),
        "env": _text_map(components.get("env")),
        "frameworks": _text_map(components.get("frameworks")),
        "model": model,
        "created_at": at,
        "compile_seconds": None if isinstance(seconds, bool) else seconds,
        "seen": seen,
    }
    if len(_dump(item)) > VARIANT_MAX_BYTES:
        return None
    return item


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _texts(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _text_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _add_variant(items: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """One item per key: the newest note, except that a miss never overwrites a
    publish (a later miss of an evicted key does not unsay that it had an entry, nor
    when it was published)."""
    old = next((item for item in items if item.get("key") == new["key"]), None)
    if old is not None and old.get("seen") == "published" and new["seen"] == "missed":
        return items
    return _add(items, new, "key")


def _add(items: list[dict[str, Any]], new: dict[str, Any], unique: str) -> list[dict[str, Any]]:
    kept = [item for item in items if item.get(unique) != new[unique]]
    kept.append(new)
    kept.sort(key=_when, reverse=True)
    return kept[:KEEP]


def _when(item: Mapping[str, Any]) -> float:
    value = item.get("created_at", item.get("at", 0.0))
    return float(value) if isinstance(value, (int, float)) else 0.0


def _dump(items: Any) -> str:
    return json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def update(
    index: Index,
    kind: str,
    namespace: str,
    name: str,
    change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> bool:
    """Apply ``change`` to a record's items with compare-and-set, retried while other
    writers get in first; False when it never got through."""
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(random.uniform(0.0, min(_PAUSE * 2**attempt, _PAUSE_MAX)))
        current = index.get_record(kind, namespace, name)
        old = current.value if current is not None else None
        value = _dump(change(read_items(old)))
        if value == old:
            return True
        record = Record(kind, namespace, name, value)
        if index.put_record(record, create_only=old is None, replacing=old):
            return True
    log.info("program map: %s %s/%s busy; note dropped", kind, namespace, name)
    return False


def read_items(value: str | None) -> list[dict[str, Any]]:
    """A record's items; a value that is not a list of objects reads as empty."""
    if value is None:
        return []
    try:
        items = json.loads(value)
    except ValueError:
        return []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def items(index: Index, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
    record = index.get_record(kind, namespace, name)
    return read_items(record.value if record is not None else None)


def variants(index: Index, namespace: str, fingerprint: str) -> list[Variant]:
    """The program map's variants of a program in a namespace, newest first."""
    return list(_variants(namespace, items(index, PROGRAM, namespace, fingerprint)))


def _variants(namespace: str, found: Iterable[Mapping[str, Any]]) -> Iterable[Variant]:
    for item in found:
        key = item.get("key")
        if not isinstance(key, str):
            continue
        seconds = item.get("compile_seconds")
        yield Variant(
            namespace=namespace,
            key=key,
            compiler_version=_text(item.get("compiler_version")),
            target=_text(item.get("target")),
            flags=tuple(_texts(item.get("flags"))),
            env=_text_map(item.get("env")),
            frameworks=_text_map(item.get("frameworks")),
            model=_text(item.get("model")),
            created_at=_when(item),
            compile_seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
            seen="published" if item.get("seen") == "published" else "missed",
        )


# --- retention

_trim_lock = threading.Lock()
# Per index object (a process may serve several, as tests do): when it was last trimmed.
_last_trim: weakref.WeakKeyDictionary[Index, float] = weakref.WeakKeyDictionary()
_last_trim_by_id: dict[int, float] = {}


def maybe_trim(index: Index, now: float | None = None) -> None:
    """``trim`` if this process has not trimmed this index for a while."""
    now = time.time() if now is None else now
    with _trim_lock:
        try:
            last = _last_trim.get(index, float("-inf"))
        except TypeError:  # an index that takes no weak reference: known by its id
            last = _last_trim_by_id.get(id(index), float("-inf"))
        if now - last < TRIM_EVERY_SECONDS:
            return
        try:
            _last_trim[index] = now
        except TypeError:
            _last_trim_by_id[id(index)] = now
    trim(index, now - RETAIN_SECONDS)


def trim(index: Index, before: float, keep: int = RECORDS_KEEP) -> int:
    """Delete program map records whose newest item is older than ``before``, and all
    but the ``keep`` newest of each kind and namespace; how many were deleted."""
    deleted = 0
    for kind in KINDS:
        by_namespace: dict[str, list[tuple[float, str]]] = {}
        for record in index.records(kind):
            newest = max(map(_when, read_items(record.value)), default=0.0)
            by_namespace.setdefault(record.namespace, []).append((newest, record.name))
        for namespace, found in by_namespace.items():
            found.sort(reverse=True)
            for rank, (newest, name) in enumerate(found):
                if newest < before or rank >= keep:
                    deleted += index.delete_record(kind, namespace, name)
    return deleted
