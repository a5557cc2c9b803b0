"""``/v1/ns/{namespace}/explain``: why a graph missed, in plain words and as data.

``GET .../explain/{key}`` explains a key the server heard of (a client's miss event, a
failure record, an entry, a removal); ``POST .../explain`` takes the key's components
and graph summary, as ``neffcache explain HLO_FILE`` and a missing client send them.
Both need a read token for the namespace and answer 200: a key nobody reported is an
explanation with reason ``unknown``, not an error. See docs/explain.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    HEX,
    NAME,
    TOKEN,
    array,
    errors,
    json_answer,
    nullable,
    obj,
    request_body,
)
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


_OBJECT = {"type": "object"}
_EXPLANATION = obj(
    {
        "namespace": NAME,
        "key": nullable(HEX),
        "reason": {"type": "string"},
        "summary": {"type": "string"},
        "sentences": array({"type": "string"}),
        "entry": nullable(_OBJECT),
        "nearest": array(_OBJECT),
        "removed": nullable(_OBJECT),
        "failure": nullable(_OBJECT),
        "graph": nullable(_OBJECT),
    }
)


@router.get(
    "/v1/ns/{namespace}/explain/{key}",
    responses={**json_answer(200, _EXPLANATION, "the explanation"), **errors(*TOKEN)},
)
async def explain_key(
    namespace: Namespace, key: Key, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("read", namespace)
    now = time.time()
    return await run_in_threadpool(_answer, backends, _for_key, caller, namespace, key, now)


@router.post(
    "/v1/ns/{namespace}/explain",
    openapi_extra=request_body(ExplainRequest),
    responses={**json_answer(200, _EXPLANATION, "the explanation"), **errors(*TOKEN, *BODY)},
)
async def explain_components(
    namespace: Namespace, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("read", namespace)  # before the body: no token, nothing read
    body = await read_body(request, _BODY_MAX)
    now = time.time()
    return await run_in_threadpool(_answer, backends, _for_body, caller, namespace, body, now)


def _for_key(backends: Backends, caller: Caller, namespace: str, key: str, now: float) -> Gathered:
    asked = asked_for_key(backends.index, namespace, key, now)
    return gather(backends, caller, asked, now)


def _for_body(
    backends: Backends, caller: Caller, namespace: str, body: bytes, now: float
) -> Gathered:
    # Up to 8 MiB of JSON, a string per instruction to validate: never on the loop.
    asked, complete = parse_request(namespace, body)
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


def _answer(
    backends: Backends, gather_: Callable[..., Gathered], caller: Caller, *args: Any
) -> dict[str, Any]:
    """The explanation, in a worker thread whatever the stores: an explanation is
    dozens of index reads (a slice of the audit log among them), and may parse a
    request of 8 MiB and a stored HLO module, each far longer than one store call."""
    gathered = gather_(backends, caller, *args)
    inputs = fill_shapes(gathered, backends.blobs) if gathered.hlo else gathered.inputs
    return explain(inputs).as_json()
