"""``POST /v1/events``: clients' telemetry, stored in the index for reports and
explanations, and counted in the metrics.

Any token may report, read-only ones included (training jobs hold those), for the
namespaces it covers: one event of another namespace refuses the whole batch (403),
as one invalid event does (400), or one too large to store (413), and nothing of it
is stored. What is stored is bounded per event (``EVENT_MAX_BYTES``) and per
namespace (``events_max_bytes``: the namespaces of a batch lose their oldest events
past it), besides the whole log's count and age.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    TOKEN,
    errors,
    json_answer,
    model_schema,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.telemetry.ingest import count, misses, note, stored_events
from neffcache.server.telemetry.schema import (
    BODY_MAX_BYTES,
    EVENT_MAX_BYTES,
    MAX_EVENTS,
    CountersEvent,
    GraphEvent,
    TelemetryEvent,
    parse_events,
)

router = APIRouter()


_SCHEMA = {
    "type": "object",
    "properties": {
        "events": {
            "type": "array",
            "maxItems": MAX_EVENTS,
            "items": {"oneOf": [model_schema(GraphEvent), model_schema(CountersEvent)]},
        }
    },
    "required": ["events"],
    "additionalProperties": False,
}


@router.post(
    "/v1/events",
    status_code=202,
    response_class=Response,
    openapi_extra=request_body(_SCHEMA),
    responses={
        **json_answer(
            202, obj({"accepted": {"type": "integer", "minimum": 0}}), "stored, all of them"
        ),
        **errors(
            *TOKEN,
            *BODY,
            e403="an event names a namespace the token does not cover",
            e413=f"a body over {BODY_MAX_BYTES} bytes, or an event over {EVENT_MAX_BYTES}"
            " bytes as stored",
        ),
    },
)
async def post_events(request: Request, caller: CallerDep, backends: BackendsDep) -> Response:
    # Read only after the caller is known (CallerDep), and never past the cap.
    body = await read_body(request, BODY_MAX_BYTES)
    now = backends.clock()
    # A worker thread even for local stores: a batch is up to 4 MiB of JSON to
    # validate, and an SQLite write may wait for another process's lock.
    batch = await run_in_threadpool(_ingest, backends, caller, body, now)
    missed = misses(batch)
    task = BackgroundTask(note, backends.index, missed, now) if missed else None
    return JSONResponse({"accepted": len(batch)}, status_code=202, background=task)


def _ingest(backends: Backends, caller: Caller, body: bytes, now: float) -> list[TelemetryEvent]:
    """Validate, check every namespace named, then store and count the whole batch."""
    batch = parse_events(body)
    for namespace in sorted({event.namespace for event in batch}):
        caller.require("read", namespace)
    events = stored_events(batch, now)  # 413 for an event too large to store
    settings = backends.settings
    before = now - settings.events_retention_seconds
    if events:
        backends.index.append_events(
            events, settings.events_keep, before, settings.events_max_bytes
        )
    count(backends.metrics, batch)  # what was stored, and only that
    return batch
