"""``GET /v1/status``: who the caller is and what the server is, and, with
``?namespace=NS``, what the namespace holds and how its clients' lookups went.

Any valid token may ask (anonymous callers too while the server has no token), so a
training image's read token can check its own set-up (``neffcache stats``, ``neffcache
doctor``): the token's scope and namespaces, the server's version, whether it takes
tokens at all, and its clock. A namespace is answered only to a token that reads it.

The hit rate comes from the clients' ``graph`` events of the window (one per graph the
client resolved, as the reports count them: ``reports/figures.py``), not from this
replica's lookup counters, which see only the requests that reached this replica and
count every probe of a graph (direct key, canonical key, stock address) apart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from neffcache.server import __version__
from neffcache.server.api.answers import (
    NUMBER,
    TOKEN,
    Schema,
    array,
    errors,
    json_answer,
    model_schema,
    nullable,
    obj,
)
from neffcache.server.auth import SCOPES, Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.manifest import NAMESPACE
from neffcache.server.namespaces import NamespacePolicy
from neffcache.server.reports.figures import graph_of
from neffcache.server.scrub import Scrub

DAY = 86400.0
DEFAULT_WINDOW = 7 * DAY
# The events' default retention: a longer window would only read what is gone.
MAX_WINDOW = 90 * DAY
EVENT_PAGE = 1000
# Events read for one answer at most (a namespace's log holds up to its
# events_max_bytes, a GiB by default): past this the counts are of the window's
# oldest events. The index's default bound on all events together.
MAX_EVENTS = 2_000_000
# Hit rates counted at once per process; more wait their turn. Each reads a window of
# events on the event loop between pages, as a report does: unbounded, callers polling
# status would take the loop that lookups need.
CONCURRENT_COUNTS = 1

router = APIRouter(prefix="/v1")

_COUNT = {"type": "integer", "minimum": 0}


def _policy_schema() -> Schema:
    """A namespace's effective policy, as ``GET /v1/admin/namespaces/{ns}`` shows it
    (``NamespacePolicy.view``)."""
    fields = model_schema(NamespacePolicy)["properties"]
    return {
        "type": "object",
        "required": sorted(fields),
        "properties": fields,
        "additionalProperties": False,
    }


_NAMESPACE_VIEW = obj(
    {
        "name": {"type": "string", "pattern": f"^{NAMESPACE}$"},
        "exists": {"type": "boolean"},
        "entries": _COUNT,
        "bytes": _COUNT,
        "quota_bytes": nullable(_COUNT),
        "policy": _policy_schema(),
        "window_seconds": NUMBER,
        "lookups": obj({"hits": _COUNT, "misses": _COUNT}),
    }
)
_SCRUB = obj(
    {
        "interval_seconds": NUMBER,
        "running": {"type": "boolean"},
        "last_full_pass": nullable(NUMBER),
        "blobs": _COUNT,
        "bytes": _COUNT,
        "mismatches": _COUNT,
    }
)
STATUS = obj(
    {
        "server": obj(
            {
                "version": {"type": "string"},
                "auth": {"type": "string", "enum": ["tokens", "open"]},
                "time": NUMBER,
            },
            # null while the store is not scrubbed (S3, memory, scrub_interval_seconds 0)
            {"scrub": nullable(_SCRUB)},
        ),
        "caller": obj(
            {
                "name": {"type": "string"},
                "scope": {"type": "string", "enum": list(SCOPES)},
                "namespaces": array({"type": "string"}),
                "trusted": {"type": "boolean"},
            }
        ),
        "namespace": nullable(_NAMESPACE_VIEW),
    }
)


@router.get(
    "/status",
    responses={
        **json_answer(200, STATUS, "the server, the caller, and the namespace asked for"),
        **errors(*TOKEN, 503),
    },
)
async def status(
    request: Request,
    caller: CallerDep,
    backends: BackendsDep,
    namespace: Annotated[
        str | None,
        Query(pattern=f"^{NAMESPACE}$", description="a namespace the token reads"),
    ] = None,
    window: Annotated[
        float,
        Query(gt=0, le=MAX_WINDOW, description="seconds of clients' lookups counted (7 days)"),
    ] = DEFAULT_WINDOW,
) -> dict[str, Any]:
    """The server's version, auth mode and clock; the caller's token; with
    ``namespace``, its entries, bytes, quota, policy and the clients' hits and misses
    over the last ``window`` seconds."""
    caller.require("read")
    if namespace is not None:
        caller.require("read", namespace)
    tokens = await backends.run(backends.tokens)
    view = None
    if namespace is not None:
        view = await _namespace(request, backends, namespace, window)
    return {
        "server": {
            "version": __version__,
            "auth": "tokens" if tokens else "open",
            "time": time.time(),  # the real clock: callers compare it with theirs
            "scrub": await _scrub(request, backends),
        },
        "caller": _caller(caller),
        "namespace": view,
    }


async def _scrub(request: Request, backends: Backends) -> dict[str, Any] | None:
    """Where the scrub stands (scrub.py): the last full pass's end and counts."""
    scrub: Scrub = request.app.state.integrity.scrub
    if not scrub.enabled:
        return None
    state = await backends.run(scrub.state)
    return {
        "interval_seconds": scrub.interval,
        "running": state is not None and state.running,
        "last_full_pass": None if state is None else state.last_full_pass,
        "blobs": 0 if state is None else state.blobs,
        "bytes": 0 if state is None else state.bytes,
        "mismatches": 0 if state is None else state.mismatches,
    }


def _caller(caller: Caller) -> dict[str, Any]:
    return {
        "name": caller.name,
        "scope": caller.scope,
        "namespaces": list(caller.namespaces),
        "trusted": caller.trusted,
    }


async def _namespace(
    request: Request, backends: Backends, namespace: str, window: float
) -> dict[str, Any]:
    policy = await backends.run(backends.policies.get, namespace)
    held = await backends.run(backends.usage.usage, namespace)
    async with _gate(request):
        hits, misses = await _lookups(backends, namespace, window)
    return {
        "name": namespace,
        "exists": policy.created or held.entries > 0,
        "entries": held.entries,
        "bytes": held.bytes,
        "quota_bytes": policy.quota_bytes,
        "policy": policy.view(),
        "window_seconds": window,
        "lookups": {"hits": hits, "misses": misses},
    }


async def _lookups(backends: Backends, namespace: str, window: float) -> tuple[int, int]:
    """Graph events of ``namespace`` in the last ``window`` seconds (on the clock
    events are stamped with): hits and misses, a page at a time through
    ``Backends.run``, the loop given back between pages."""
    until = backends.clock()
    since = until - window
    hits = misses = read = 0
    after: str | None = None
    while read < MAX_EVENTS:
        page, after = await backends.run(
            backends.index.events, since, until, [namespace], after, EVENT_PAGE
        )
        read += len(page)
        for event in page:
            graph = graph_of(event)
            if graph is not None:
                hits += graph.hit
                misses += not graph.hit
        if after is None:
            break
        await asyncio.sleep(0)
    return hits, misses


def _gate(request: Request) -> asyncio.Semaphore:
    """The app's bound on hit rates counted at once, one per event loop (a semaphore
    belongs to the loop it first waits on; tests run an app on several loops)."""
    loop = asyncio.get_running_loop()
    found: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = getattr(
        request.app.state, "status_gate", None
    )
    if found is None or found[0] is not loop:
        found = request.app.state.status_gate = (loop, asyncio.Semaphore(CONCURRENT_COUNTS))
    return found[1]
