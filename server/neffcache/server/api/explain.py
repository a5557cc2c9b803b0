"""``/v1/ns/{namespace}/explain``: why a graph missed, in plain words and as data.

``GET .../explain/{key}`` explains a key the server heard of (a client's miss event, a
failure record, an entry, a removal); ``POST .../explain`` takes the key's components
and graph summary, as ``neffcache explain HLO_FILE`` and a missing client send them.
Both need a read token for the namespace and answer 200: a key nobody reported is an
explanation with reason ``unknown``, not an error. See docs/explain.md.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.body import read_body
from neffcache.server.api.entries import Key, Namespace
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.explain.engine import explain
from neffcache.server.explain.facts import Asked
from neffcache.server.explain.gather import Gathered, asked_for_key, fill_shapes, gather
from neffcache.server.explain.request import ExplainRequest, parse_request

router = APIRouter()

# Shapes of a large graph (a string per instruction) are most of a request.
_BODY_MAX = 8 * 2**20


@router.get("/v1/ns/{namespace}/explain/{key}")
async def explain_key(
    namespace: Namespace, key: Key, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("read", namespace)
    gathered = await backends.run(_for_key, backends, caller, namespace, key, time.time())
    return await _answer(backends, gathered)


@router.post(
    "/v1/ns/{namespace}/explain",
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": ExplainRequest.model_json_schema()}}
        }
    },
)
async def explain_components(
    namespace: Namespace, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("read", namespace)  # before the body: no token, nothing read
    asked, complete = parse_request(namespace, await read_body(request, _BODY_MAX))
    now = time.time()
    gathered = await backends.run(_for_asked, backends, caller, asked, complete, now)
    return await _answer(backends, gathered)


def _for_key(backends: Backends, caller: Caller, namespace: str, key: str, now: float) -> Gathered:
    asked = asked_for_key(backends.index, namespace, key, now)
    return gather(backends, caller, asked, now)


def _for_asked(
    backends: Backends, caller: Caller, asked: Asked, complete: bool, now: float
) -> Gathered:
    if not complete and asked.key is not None:
        found = asked_for_key(backends.index, asked.namespace, asked.key, now)
        asked = Asked(
            asked.namespace,
            asked.key,
            found.components,
            found.graph,
            asked.model or found.model,
            found.missed_at,
        )
    return gather(backends, caller, asked, now)


async def _answer(backends: Backends, gathered: Gathered) -> dict[str, Any]:
    inputs = gathered.inputs
    if gathered.hlo:
        # Parsing a stored HLO module takes a while for a large graph: never on the
        # event loop, whatever the stores.
        inputs = await run_in_threadpool(fill_shapes, gathered, backends.blobs)
    return explain(inputs).as_json()
