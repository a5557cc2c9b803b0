"""The body of ``POST /v1/events``, validated strictly (as failure reports are).

``{"events": [event, ...]}``: at most ``MAX_EVENTS`` events, each a ``graph`` or a
``counters`` event naming its namespace. Types are not coerced (``"1"`` is not a
pid), unknown fields are refused by name, NaN and infinities are refused, strings and
numbers are bounded. One bad event refuses the whole batch, so nothing is half-stored
and the client's error names what to fix.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from neffcache.protocol import COUNTER_NAME, MODEL_LABEL, MODEL_LABEL_MAX
from neffcache.server.errors import BadRequest
from neffcache.server.manifest import (
    HEX64,
    NAMESPACE,
    canonical_json,
    check_neuron_address,
    load_json,
    refuse_unknown,
    validated,
)

# A batch at most: the client sends at most 500 events and 1 MiB per request.
MAX_EVENTS = 1000
BODY_MAX_BYTES = 4 << 20
# A miss's components (with the graph summary's shapes), as canonical JSON.
COMPONENTS_MAX_BYTES = 64 << 10
# An event as stored (its canonical JSON body, stamps included) at most; over it, the
# graph summary's shapes are left out, and an event still over it is refused (413).
# The events the client builds (telemetry.graph_event) from the tests' fixtures take
# 462 bytes (a hit), 1,291 (a counters event naming every client counter) and about
# 1,200 (a miss with its components) plus 18 to 24 bytes per instruction of shapes:
# each fits more than 12 times over, shapes apart. With events_max_bytes it fixes the
# worst case: a namespace holds at least events_max_bytes / EVENT_MAX_BYTES events,
# and the whole log at most events_keep * EVENT_MAX_BYTES bytes (docs/telemetry.md).
EVENT_MAX_BYTES = 16 << 10
# Shapes are sent only for graphs of at most this many instructions.
MAX_SHAPES = 2048
NAME_MAX = 255
CODE_MAX = 64  # a reason or a fall-back
MAX_COUNTERS = 64
# No compile, fetch or saving lasts longer: a larger value is a client's bug.
MAX_SECONDS = 7 * 86400.0
# int64, so every JSON reader can read it back.
INT64_MAX = 2**63 - 1
# Fields the server sets in stored events; a client may not send them. ``trimmed``
# names what was left out of an event to fit EVENT_MAX_BYTES.
STAMPS = frozenset({"client_at", "trimmed"})

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Name = Annotated[str, Field(max_length=NAME_MAX, pattern=_PRINTABLE)]
Code = Annotated[str, Field(min_length=1, max_length=CODE_MAX, pattern=_PRINTABLE)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Hex64 = Annotated[str, Field(pattern=f"^{HEX64}$")]
CounterName = Annotated[str, Field(pattern=f"^{COUNTER_NAME}$")]

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Event(BaseModel):
    """The fields every event may carry."""

    model_config = _STRICT

    namespace: str = Field(pattern=f"^{NAMESPACE}$")
    # The client's clock, epoch seconds; stored as ``client_at``.
    at: float | None = Field(None, ge=0, allow_inf_nan=False)
    job_id: Name | None = None
    host: Name | None = None
    instance_type: Name | None = None
    model: str | None = Field(
        None, min_length=1, max_length=MODEL_LABEL_MAX, pattern=f"^{MODEL_LABEL}$"
    )
    via: Literal["hook", "wrapper", "prewarm"] | None = None
    pid: Count | None = None


class GraphSummary(BaseModel):
    """``components.graph``: the structure digest, and the per-instruction shapes of
    small graphs, for explanations."""

    model_config = _STRICT

    structure: Hex64
    instructions: Count
    shapes: list[Name] | None = Field(None, max_length=MAX_SHAPES)

    @model_validator(mode="after")
    def _shapes_of_small_graphs(self) -> GraphSummary:
        if self.shapes is not None and self.instructions > MAX_SHAPES:
            raise ValueError(
                f"shapes are sent only for graphs of at most {MAX_SHAPES} instructions"
            )
        return self


class Components(BaseModel):
    """A key's components as in a manifest; the ones explanations compare are typed,
    others (``key_version``, ``frameworks``, later ones) kept as sent."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    fingerprint: Hex64 | None = None
    compiler_version: Name | None = None
    target: Name | None = None
    flags: list[str] | None = None
    env: dict[str, str] | None = None
    graph: GraphSummary | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            size = len(canonical_json(raw))  # ASCII: characters are bytes
            if size > COMPONENTS_MAX_BYTES:
                raise ValueError(
                    f"components take {size} bytes as JSON, over {COMPONENTS_MAX_BYTES}"
                    " (leave out graph.shapes)"
                )
        return raw


class GraphEvent(_Event):
    """One graph the client resolved: the facts of its run-manifest line."""

    kind: Literal["graph"]
    key: Hex64 | None = None
    direct_key: Hex64 | None = None
    neuron_address: str | None = None
    result: Literal["hit", "miss"]
    source: Literal["l1", "server", "compiler"] | None = None
    reason: Code | None = None
    fetch_seconds: Seconds | None = None
    compile_seconds: Seconds | None = None
    outcome: Literal["ok", "failed"] | None = None
    saved_seconds: Seconds | None = None
    bytes: Count | None = None
    fallback: Code | None = None
    compiler_version: Name | None = None
    components: Components | None = None

    @field_validator("neuron_address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        return check_neuron_address(address)


class CountersEvent(_Event):
    """The client's ``Stats`` counters, as deltas since its previous counters event."""

    kind: Literal["counters"]
    counts: dict[CounterName, Count] = Field(max_length=MAX_COUNTERS)


TelemetryEvent = GraphEvent | CountersEvent
_KINDS: dict[str, type[GraphEvent] | type[CountersEvent]] = {
    "graph": GraphEvent,
    "counters": CountersEvent,
}


def parse_events(body: bytes) -> list[TelemetryEvent]:
    """Validate a batch; BadRequest (one line) names the first bad event's problems."""
    raw = load_json(body, "events body")
    if not isinstance(raw, dict) or "events" not in raw:
        raise BadRequest('the events body is a JSON object {"events": [event, ...]}')
    unknown = sorted(set(raw) - {"events"})
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)} (the body has only events)")
    items = raw["events"]
    if not isinstance(items, list):
        raise BadRequest("events must be a JSON array of events")
    if len(items) > MAX_EVENTS:
        raise BadRequest(f"{len(items)} events in one request; send at most {MAX_EVENTS}")
    return [parse_event(i, item) for i, item in enumerate(items)]


def parse_event(i: int, raw: Any) -> TelemetryEvent:
    """Event number ``i`` of a batch (counted from 0, as errors name it)."""
    what = f"event {i}"
    if not isinstance(raw, dict):
        raise BadRequest(f"{what} is not a JSON object")
    model = _KINDS.get(raw["kind"]) if isinstance(raw.get("kind"), str) else None
    if model is None:
        raise BadRequest(f'{what}: kind must be "graph" or "counters"')
    refuse_unknown(raw, model, STAMPS, f"a {raw['kind']} event", where=what)
    return validated(model, raw, what)
