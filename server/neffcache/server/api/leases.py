"""``/v1/ns/{namespace}/leases/{name}``: who compiles a missing graph, so a fleet that
starts cold compiles it once.

``POST`` answers with the entry when it exists (``done``), the lease when nobody holds
it (``granted``), and otherwise waits up to ``wait`` seconds for one of those before
answering ``held`` (a long-poll: the request sleeps until a publish or a release wakes
it, or the holder's lease runs out). A holder renews with ``PUT`` and ends with
``DELETE``; a failed compile leaves a short notice (``failed``) so that the waiters do
not queue up to repeat it one after another. The lease is an optimisation: the
client bounds its wait and compiles itself after it (docs/protocol.md).

Who is granted what is services/leases.py; this module is the HTTP side and the wait.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from neffcache.protocol import LEASE_ID, LeaseOutcome, is_alias
from neffcache.server.api.answers import (
    BODY,
    ENTRY,
    FAILURE,
    NUMBER,
    SECONDS,
    TOKEN,
    Schema,
    errors,
    json_answer,
    no_body,
    nullable,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.api.entries import Namespace
from neffcache.server.api.rules import require_writer
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest
from neffcache.server.manifest import load_json, validated
from neffcache.server.services import leases

router = APIRouter()

Name = Annotated[str, PathParam(description="a key, a direct key or a Neuron address")]
LeaseId = Annotated[str, Query(alias="lease", pattern=f"^{LEASE_ID}$")]
_BODY_MAX = 4096


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    holder: str = Field("", max_length=200, description="who asks (host and pid), for people")
    wait: float = Field(0.0, ge=0, le=600, allow_inf_nan=False, description="seconds to wait")
    expected_seconds: float | None = Field(
        None, ge=0, le=30 * 86400, allow_inf_nan=False, description="the asker's estimate"
    )
    waited: float = Field(
        0.0, ge=0, le=30 * 86400, allow_inf_nan=False, description="seconds already waited"
    )
    dead_holder: str | None = Field(
        None, max_length=200, description="a holder the asker knows is dead (same host)"
    )
    take: bool = Field(
        True, description="false: only wait for a holder; never be granted the lease"
    )


def _check_name(name: str) -> str:
    if not is_alias(name):
        raise BadRequest(f"{name!r} is neither a key nor a Neuron cache address")
    return name


def _state(name: str) -> Schema:
    return {"type": "string", "enum": [name]}


_GRANTED = obj(
    {
        "state": _state("granted"),
        "lease": {"type": "string", "pattern": f"^{LEASE_ID}$"},
        "ttl": NUMBER,
        "expires_in": NUMBER,
    }
)
_HELD = {
    "holder": {"type": "string"},
    "held_for": SECONDS,
    "expires_in": SECONDS,
    "expected_seconds": nullable(SECONDS),
    "ttl": NUMBER,
}
_SETTLED = {
    "oneOf": [
        obj({"state": _state("done"), "entry": ENTRY}),
        obj({"state": _state("failed"), **_HELD, "failure": nullable(FAILURE)}),
        obj({"state": _state("free")}),
    ]
}
_CONFLICT = "the lease does not hold the name (released, or expired)"


@router.post(
    "/v1/ns/{namespace}/leases/{name:path}",
    response_class=Response,
    openapi_extra=request_body(LeaseRequest),
    responses={
        **json_answer(200, _SETTLED, "done (the entry), failed (the holder's failure), or free"),
        **json_answer(201, _GRANTED, "granted: the caller holds the lease"),
        **json_answer(202, obj({"state": _state("held"), **_HELD}), "held by someone else"),
        **no_body(204, "the client went away while it waited (nobody reads this)"),
        **errors(*TOKEN, *BODY),
    },
)
async def ask_lease(
    namespace: Namespace, name: Name, request: Request, caller: CallerDep, backends: BackendsDep
) -> Response:
    # Write scope: a caller that cannot publish must not make others wait for it.
    await require_writer(backends, caller, namespace)
    _check_name(name)
    body = await read_body(request, _BODY_MAX)
    asked = validated(LeaseRequest, load_json(body, "lease request") if body else {}, "request")
    settings = backends.settings
    wait = min(asked.wait, settings.lease_wait_max_seconds)
    deadline = time.monotonic() + wait
    asking = leases.Asking(
        holder=asked.holder or caller.name,
        # Failure notices older than the asker's wait are not its business: only those
        # who waited while the compile failed hear of it; a later asker compiles again.
        since=time.time() - asked.waited,
        expected_seconds=asked.expected_seconds,
        dead_holder=asked.dead_holder,
        take=asked.take,
    )
    first = True
    while True:
        if not first and await request.is_disconnected():
            # Gone mid-wait (killed, or cut off by a proxy): a lease granted now would
            # be held by no one, and every other waiter would sit out its TTL.
            return Response(status_code=204)
        first = False
        with backends.wakeups.watch(namespace, name) as woken:
            # A worker thread even for local stores: granting is a write, which may
            # wait for another process's lock on a shared SQLite file.
            answer = await run_in_threadpool(leases.look, backends, namespace, name, asking)
            remaining = deadline - time.monotonic()
            if answer.state != "held" or remaining <= 0:
                metrics = backends.metrics
                metrics.lease_answers.labels(metrics.namespace(namespace), answer.state).inc()
                metrics.lease_wait.observe(time.monotonic() - deadline + wait)
                return await _respond(backends, namespace, name, answer)
            assert answer.lease is not None
            # Wake on a publish or release here, when the holder's lease runs out (then
            # this waiter may take over), or to look again for another replica's events.
            expiry = answer.lease.expires_at - time.time() + 0.01
            timeout = min(remaining, max(expiry, 0.01), settings.lease_recheck_seconds)
            await backends.wakeups.sleep(woken, timeout)


async def _respond(
    backends: Backends, namespace: str, name: str, answer: leases.Answer
) -> Response:
    if answer.state == "done":
        assert answer.entry is not None
        body = '{"state":"done","entry":' + answer.entry + "}"
        return Response(body.encode(), media_type="application/json")
    if answer.state == "free":
        return JSONResponse({"state": "free"})
    if answer.state == "granted":
        assert answer.lease is not None
        ttl = backends.settings.lease_ttl_seconds
        lease_id = answer.lease.lease_id
        granted = {"state": "granted", "lease": lease_id, "ttl": ttl, "expires_in": ttl}
        return JSONResponse(granted, status_code=201)
    fields = await run_in_threadpool(leases.holder_view, backends, namespace, name, answer)
    return JSONResponse(fields, status_code=202 if answer.state == "held" else 200)


@router.put(
    "/v1/ns/{namespace}/leases/{name:path}",
    response_class=Response,
    responses={
        **json_answer(200, _GRANTED, "renewed for one ttl"),
        **errors(*TOKEN, 409, e409=_CONFLICT),
    },
)
async def renew_lease(
    namespace: Namespace, name: Name, lease_id: LeaseId, caller: CallerDep, backends: BackendsDep
) -> Response:
    await require_writer(backends, caller, namespace)
    _check_name(name)
    await run_in_threadpool(leases.renew, backends, namespace, name, lease_id)
    ttl = backends.settings.lease_ttl_seconds
    return JSONResponse({"state": "granted", "lease": lease_id, "ttl": ttl, "expires_in": ttl})


@router.delete(
    "/v1/ns/{namespace}/leases/{name:path}",
    status_code=204,
    responses={**no_body(204, "released"), **errors(*TOKEN, 409, e409=_CONFLICT)},
)
async def release_lease(
    namespace: Namespace,
    name: Name,
    lease_id: LeaseId,
    caller: CallerDep,
    backends: BackendsDep,
    outcome: Annotated[LeaseOutcome, Query()] = "done",
) -> Response:
    await require_writer(backends, caller, namespace)
    _check_name(name)
    failed = outcome == "failed"
    await run_in_threadpool(leases.release, backends, namespace, name, lease_id, failed)
    backends.wakeups.notify(namespace, [name])
    return Response(status_code=204)
