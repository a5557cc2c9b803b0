"""From a validated batch to what the server keeps: the stored events, the metrics,
and the program map's notes of missed graphs (for explanations)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from neffcache.server.errors import TooLarge
from neffcache.server.explain.reasons import reason_label
from neffcache.server.index import Index
from neffcache.server.index.base import Event
from neffcache.server.manifest import canonical_json
from neffcache.server.metrics import Metrics
from neffcache.server.telemetry.counters import counter_label
from neffcache.server.telemetry.schema import EVENT_MAX_BYTES, GraphEvent, TelemetryEvent

log = logging.getLogger("neffcache.server.telemetry")

# Batches whose misses are noted at once, per process. Each holds a worker thread of
# the pool that remote stores' calls (and so every request on Redis) also wait for,
# for as long as its notes take: a burst of misses (a compiler upgrade) must not take
# them all. A batch arriving while these are busy is not noted (best-effort).
NOTE_BATCHES = 2
_noting = threading.BoundedSemaphore(NOTE_BATCHES)
_skipped: dict[str, float] = {"graphs": 0, "logged": float("-inf")}
_SKIPPED_LOG_SECONDS = 60.0


def stored_events(batch: Sequence[TelemetryEvent], now: float) -> list[Event]:
    """The events as stored: each one's fields (nulls left out), with the client's
    ``at`` kept as ``client_at`` and the server's receipt time ``now`` as ``at``;
    each within ``EVENT_MAX_BYTES`` (``fitted``), or TooLarge names the first that
    is not."""
    stored = []
    for i, event in enumerate(batch):
        fields = event.model_dump(mode="json", exclude_none=True)
        client_at = fields.pop("at", None)
        fields["at"] = now
        if client_at is not None:
            fields["client_at"] = client_at
        key = event.key if isinstance(event, GraphEvent) and event.key else ""
        stored.append(Event(now, event.namespace, event.kind, key, fitted(i, fields)))
    return stored


def fitted(i: int, fields: dict[str, Any]) -> str:
    """The stored body of event ``i``: its canonical JSON (ASCII: characters are
    bytes), within EVENT_MAX_BYTES. Over it, the graph summary's shapes are left out
    and ``trimmed`` says so: they are the one part a client legitimately sends that
    large (up to 2048 instructions' worth), explanations do without them (as for
    larger graphs, whose shapes are never sent), and reports never read them. Any
    event still over it is refused: no client of ours sends one, and leaving out
    anything else would change what reports or explanations see."""
    body = canonical_json(fields)
    if len(body) > EVENT_MAX_BYTES:
        graph = fields.get("components", {}).get("graph", {})
        if graph.pop("shapes", None) is not None:
            fields["trimmed"] = ["components.graph.shapes"]
            body = canonical_json(fields)
    if len(body) > EVENT_MAX_BYTES:
        raise TooLarge(
            f"event {i} takes {len(body)} bytes as stored, over the {EVENT_MAX_BYTES}-byte"
            " limit of a stored event (docs/telemetry.md)"
        )
    return body


def count(metrics: Metrics, batch: Sequence[TelemetryEvent]) -> None:
    """Count a stored batch in the metrics; every label is bounded (namespaces by
    ``Metrics.namespace``, reasons by the shared codes, counters by an allowlist)."""
    for event in batch:
        metrics.events_received.labels(event.kind).inc()
        if isinstance(event, GraphEvent):
            # Only metrics labelled by namespace take one of the bounded labels.
            namespace = metrics.namespace(event.namespace)
            source = event.source or "unknown"
            metrics.client_graphs.labels(namespace, event.result, source).inc()
            if event.result == "miss":
                metrics.client_misses.labels(namespace, reason_label(event.reason)).inc()
                # As the cost report counts compiles (reports/figures.py): a miss that
                # reports an outcome or a compile time compiled.
                if event.outcome is not None or event.compile_seconds is not None:
                    outcome = "failed" if event.outcome == "failed" else "ok"
                    metrics.client_compiles.labels(namespace, outcome).inc()
            if event.fetch_seconds is not None:
                metrics.client_fetch_seconds.observe(event.fetch_seconds)
            if event.compile_seconds is not None:
                metrics.client_compile_seconds.observe(event.compile_seconds)
        else:
            for name, n in event.counts.items():
                if n:
                    metrics.client_counters.labels(counter_label(name)).inc(n)


def misses(batch: Sequence[TelemetryEvent]) -> list[GraphEvent]:
    """The misses of a batch that carry their key's components."""
    return [
        event
        for event in batch
        if isinstance(event, GraphEvent) and event.result == "miss" and event.components
    ]


def note(index: Index, missed: Sequence[GraphEvent], now: float) -> None:
    """Hand missed graphs to the program map (explanations). Best-effort, after the
    answer: the events are stored already, and no trouble here may fail or slow their
    request. At most ``NOTE_BATCHES`` batches at once; others are skipped (logged at
    most once a minute). Imported here, so that the events API never depends on the
    explanations loading."""
    if not _noting.acquire(blocking=False):
        _skip(len(missed))
        return
    try:
        _note(index, missed, now)
    finally:
        _noting.release()


def _note(index: Index, missed: Sequence[GraphEvent], now: float) -> None:
    try:
        from neffcache.server.explain.notes import MissNote, note_misses

        notes = [
            MissNote(
                namespace=event.namespace,
                key=event.key or "",
                components=event.components.model_dump(mode="json", exclude_none=True)
                if event.components
                else {},
                model=event.model or "",
                at=now,
            )
            for event in missed
        ]
        note_misses(index, notes)
    except Exception:
        log.exception("cannot note %d missed graph(s) in the program map", len(missed))


def _skip(count: int) -> None:
    # Unlocked: a lost increment only misstates a log line.
    _skipped["graphs"] += count
    now = time.monotonic()
    if now - _skipped["logged"] >= _SKIPPED_LOG_SECONDS:
        log.warning(
            "program map busy (%d batches being noted): %d missed graph(s) not noted",
            NOTE_BATCHES,
            _skipped["graphs"],
        )
        _skipped["graphs"], _skipped["logged"] = 0, now
