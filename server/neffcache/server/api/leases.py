"""``/v1/ns/{namespace}/leases/{name}``: who compiles a missing graph, so a fleet that
starts cold compiles it once.

``POST`` answers with the entry when it exists (``done``), the lease when nobody holds
it (``granted``), and otherwise waits up to ``wait`` seconds for one of those before
answering ``held`` (a long-poll: the request sleeps until a publish or a release wakes
it, or the holder's lease runs out). A holder renews with ``PUT`` and ends with
``DELETE``; a failed compile leaves a short notice (``failed``) so that the waiters do
not queue up to repeat it one after another. The lease is an optimisation: the
client bounds its wait and compiles itself after it (docs/protocol.md).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

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
from neffcache.server.api.entries import ALIAS, Namespace, stamped
from neffcache.server.api.rules import require_writer
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, Conflict
from neffcache.server.index import Failure, Lease
from neffcache.server.lookup import find_name
from neffcache.server.manifest import HEX64, load_json, validated
from neffcache.server.settings import ServerSettings

router = APIRouter()

Name = Annotated[str, PathParam(description="a key, a direct key or a Neuron address")]
LeaseId = Annotated[str, Query(alias="lease", pattern="^[0-9a-f]{32}$")]
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


@dataclass(frozen=True)
class _Answer:
    state: Literal["done", "granted", "held", "failed", "free"]
    entry: str | None = None  # the entry's JSON, when done
    lease: Lease | None = None  # ours when granted, else the live one


def _check_name(name: str) -> str:
    if not re.fullmatch(ALIAS, name):
        raise BadRequest(f"{name!r} is neither a key nor a Neuron cache address")
    return name


def _state(name: str) -> Schema:
    return {"type": "string", "enum": [name]}


_GRANTED = obj(
    {
        "state": _state("granted"),
        "lease": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
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
    holder = asked.holder or caller.name
    deadline = time.monotonic() + wait
    # Failure notices older than the asker's wait are not its business: only those
    # who waited while the compile failed hear of it; a later asker compiles again.
    since = time.time() - asked.waited
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
            answer = await run_in_threadpool(_try, backends, namespace, name, holder, asked, since)
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


def _try(
    backends: Backends,
    namespace: str,
    name: str,
    holder: str,
    asked: LeaseRequest,
    since: float,
) -> _Answer:
    """One look: the entry if it exists, else the lease (ours if it was free)."""
    index = backends.index
    found = _entry(backends, namespace, name)
    if found is not None:
        return _Answer("done", entry=found)
    now = time.time()
    # A read first: a lease that is held (the common answer while waiting) costs no
    # write transaction.
    live = index.get_lease(namespace, name, now)
    ttl = backends.settings.lease_ttl_seconds
    replacing = None
    if live is not None and live.failed and live.expires_at - ttl < since:
        replacing = live.lease_id  # failed before this asker began to wait
    elif live is not None and not live.failed and live.holder == asked.dead_holder:
        replacing = live.lease_id
    if (live is None or replacing is not None) and not asked.take:
        return _Answer("free")
    if live is None or replacing is not None:
        expected = asked.expected_seconds
        mine = Lease(namespace, name, secrets.token_hex(16), holder, now, now + ttl, expected)
        live = index.acquire_lease(mine, replacing)
        if live.lease_id == mine.lease_id:
            # The entry may have been published, and its lease released, between the
            # look at the entry and this grant: then there is nothing to compile.
            found = _entry(backends, namespace, name)
            if found is not None:
                index.release_lease(namespace, name, mine.lease_id, None)
                return _Answer("done", entry=found)
            return _Answer("granted", lease=live)
    return _Answer("failed" if live.failed else "held", lease=live)


def _entry(backends: Backends, namespace: str, name: str) -> str | None:
    """The entry a lease name stands for (its key, or an alias), as the API returns it;
    read through as a lookup is, so a graph another namespace holds is not compiled."""
    found = find_name(backends, namespace, name)
    return None if found is None else stamped(found)


async def _respond(backends: Backends, namespace: str, name: str, answer: _Answer) -> Response:
    if answer.state == "done":
        assert answer.entry is not None
        body = '{"state":"done","entry":' + answer.entry + "}"
        return Response(body.encode(), media_type="application/json")
    if answer.state == "free":
        return JSONResponse({"state": "free"})
    lease = answer.lease
    assert lease is not None
    now = time.time()
    ttl = backends.settings.lease_ttl_seconds
    if answer.state == "granted":
        granted = {"state": "granted", "lease": lease.lease_id, "ttl": ttl, "expires_in": ttl}
        return JSONResponse(granted, status_code=201)
    failures: list[Failure] = []
    if re.fullmatch(HEX64, name):
        failures = await run_in_threadpool(backends.index.failures, namespace, name, now)
    fields: dict[str, Any] = {
        "state": answer.state,
        "holder": lease.holder,
        "held_for": round(max(0.0, now - lease.acquired_at), 3),
        "expires_in": round(max(0.0, lease.expires_at - now), 3),
        "expected_seconds": _expected(
            lease.expected_seconds, _history(failures), backends.settings
        ),
        "ttl": ttl,
    }
    if answer.state == "failed":
        # The record of this failure, never an older one: the holder reports it
        # after its compile, which began when it took the lease.
        mine = [f for f in failures if f.created_at >= lease.acquired_at]
        fields["failure"] = json.loads(mine[0].record) if mine else None
    return JSONResponse(fields, status_code=202 if answer.state == "held" else 200)


def _expected(claim: float | None, known: float | None, settings: ServerSettings) -> float | None:
    """The compile time told to waiters. The holder's claim is any write token's word
    (a squatter claims a month and renews): it is believed no further than twice what
    this graph's own history says, when there is one, nor past the server's maximum.
    The waiter bounds it again by its own setting (client/lease.py)."""
    told = known if claim is None else claim if known is None else min(claim, 2 * known)
    return None if told is None else min(told, settings.lease_expected_max_seconds)


def _history(failures: list[Failure]) -> float | None:
    """How long this graph's compile took before, from its recent failure records."""
    for failure in failures:
        try:
            seconds = json.loads(failure.record).get("compile_seconds")
        except ValueError:
            continue
        if isinstance(seconds, (int, float)) and seconds >= 0:
            return float(seconds)
    return None


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
    ttl = backends.settings.lease_ttl_seconds
    renewed = await run_in_threadpool(
        backends.index.renew_lease, namespace, name, lease_id, time.time() + ttl
    )
    if not renewed:
        raise Conflict(f"lease {lease_id} no longer holds {name}: it expired or was released")
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
    outcome: Annotated[Literal["done", "failed"], Query()] = "done",
) -> Response:
    await require_writer(backends, caller, namespace)
    _check_name(name)
    settings = backends.settings
    # The notice outlives the release by one lease lifetime: long enough for every
    # waiter to hear of it (they are woken now), short enough that a retry soon after
    # a transient failure is not refused.
    until = time.time() + settings.lease_ttl_seconds if outcome == "failed" else None
    released = await run_in_threadpool(
        backends.index.release_lease, namespace, name, lease_id, until
    )
    if not released:
        raise Conflict(f"lease {lease_id} does not hold {name}")
    backends.wakeups.notify(namespace, [name])
    return Response(status_code=204)
