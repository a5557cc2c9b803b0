"""``/v1/admin/evict``, ``/v1/admin/expire`` and ``/v1/admin/audit``.

``evict`` with ``dry_run`` lists what the rules would remove now, with the bytes and
compile hours at stake; without it, runs a pass now on this replica (if no other
replica is the evictor). ``expire`` retires compiler versions: every unpinned entry
they built goes. Both need admin rights over every namespace they touch; a pass
without ``dry_run`` touches all, so it needs an admin token for ``*``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    HEX,
    NAME,
    NUMBER,
    TOKEN,
    array,
    errors,
    json_answer,
    nullable,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, Conflict, Forbidden
from neffcache.server.eviction.evictor import Applied, victim_detail
from neffcache.server.eviction.plan import Plan, Victim
from neffcache.server.manifest import NAMESPACE, load_json, validated

router = APIRouter(prefix="/v1/admin")
_BODY_MAX = 64 * 1024
_AUDIT_MAX = 10_000


class EvictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A pass changes every namespace, so only an explicit false runs one; an expiry
    # names what it retires, and runs unless told otherwise.
    dry_run: bool = Field(True, description="list what would go; change nothing (default)")
    namespaces: list[str] | None = Field(
        None, max_length=1000, description="only these (dry run); default: all you administer"
    )


class ExpireRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    compiler_version: str = Field(
        min_length=1, max_length=200, description="a version, or a pattern such as 2.20.*"
    )
    dry_run: bool = Field(False, description="list what would go; change nothing")
    namespaces: list[str] | None = Field(
        None, max_length=1000, description="only these; default: all you administer"
    )


async def _parse(request: Request, model: type[Any], what: str) -> Any:
    body = await read_body(request, _BODY_MAX)
    return validated(model, load_json(body, what) if body.strip() else {}, what)


def _scope(backends: Backends, caller: Caller, asked: list[str] | None) -> list[str]:
    """The namespaces an admin request acts on, each one the caller administers."""
    caller.require("admin")
    if asked is None:
        return [n for n in backends.index.namespaces() if caller.covers(n)]
    for namespace in asked:
        if not _valid(namespace):
            raise BadRequest(f"{namespace!r} is not a namespace name")
        caller.require("admin", namespace)
    return sorted(set(asked))


def _valid(namespace: str) -> bool:
    return re.fullmatch(NAMESPACE, namespace) is not None


_COUNT = {"type": "integer", "minimum": 0}
_VICTIM = obj(
    {
        "namespace": NAME,
        "key": HEX,
        "reason": {"type": "string"},
        "why": {"type": "string"},
        "bytes": _COUNT,
        "compile_seconds": nullable(NUMBER),
        "compiler_version": {"type": "string"},
        "model": {"type": "string"},
        "last_access": NUMBER,
        "hits": _COUNT,
    }
)
_TOTALS = {
    "entries": array(_VICTIM),
    "total": obj(
        {
            "entries": _COUNT,
            "bytes": _COUNT,
            "compile_hours": NUMBER,
            "unknown_compile_time": _COUNT,
        }
    ),
}
_PLAN = obj(
    {
        "namespace": NAME,
        "entries": _COUNT,
        "bytes": _COUNT,
        "bytes_after": _COUNT,
        "pinned_bytes": _COUNT,
        "over_quota_pinned": {"type": "boolean"},
    }
)
_PASS = {
    "removed": obj({**_TOTALS, "skipped": _COUNT}),
    "blobs_collected": _COUNT,
    "blob_bytes_collected": _COUNT,
    "blobs_in_grace": _COUNT,
}
_EVICTED = {
    "oneOf": [
        obj(
            {"dry_run": {"type": "boolean", "enum": [True]}, "namespaces": array(_PLAN), **_TOTALS}
        ),
        obj(
            {
                "dry_run": {"type": "boolean", "enum": [False]},
                "namespaces": array(_PLAN),
                **_TOTALS,
                **_PASS,
            }
        ),
    ]
}
_EXPIRED = obj(
    {"dry_run": {"type": "boolean"}, "compiler_version": {"type": "string"}, **_TOTALS},
    {"skipped": _COUNT},
)
_AUDIT = obj(
    {
        "records": array(
            obj(
                {
                    "at": NUMBER,
                    "actor": {"type": "string"},
                    "action": {"type": "string"},
                    "namespace": {"type": "string"},
                    "target": {"type": "string"},
                    "detail": {},
                }
            )
        )
    }
)


@router.post(
    "/evict",
    openapi_extra=request_body(EvictRequest),
    responses={
        **json_answer(200, _EVICTED, "the plan (dry run), or the plan and what the pass did"),
        **errors(*TOKEN, *BODY, 409, e409="another replica is the evictor"),
    },
)
async def evict(request: Request, caller: CallerDep, backends: BackendsDep) -> dict[str, Any]:
    asked: EvictRequest = await _parse(request, EvictRequest, "eviction request")
    if asked.dry_run:
        names = await run_in_threadpool(_scope, backends, caller, asked.namespaces)
        # This replica's latest hits first, as a pass does: a dry run lists what a pass
        # now would remove.
        await run_in_threadpool(backends.maintenance.flush)
        plans = await run_in_threadpool(backends.evictor.plan, names)
        return {"dry_run": True, **_plans_view(plans)}
    caller.require("admin")
    if "*" not in caller.namespaces:
        raise Forbidden("an eviction pass covers every namespace: it needs an admin token for '*'")
    if asked.namespaces is not None:
        raise BadRequest("a pass covers every namespace; namespaces is for dry runs")
    done = await run_in_threadpool(backends.maintenance.run, caller.label)
    if done is None:
        leader = await run_in_threadpool(backends.maintenance.leader)
        raise Conflict(f"another replica ({leader}) is the evictor; it applies the same rules")
    view = _plans_view(done.plans)
    view["removed"] = _applied_view(done.applied)
    view["blobs_collected"] = done.collected.blobs
    view["blob_bytes_collected"] = done.collected.bytes
    view["blobs_in_grace"] = done.collected.waiting
    return {"dry_run": False, **view}


@router.post(
    "/expire",
    openapi_extra=request_body(ExpireRequest),
    responses={
        **json_answer(200, _EXPIRED, "the entries retired (or that would be)"),
        **errors(*TOKEN, *BODY),
    },
)
async def expire(request: Request, caller: CallerDep, backends: BackendsDep) -> dict[str, Any]:
    asked: ExpireRequest = await _parse(request, ExpireRequest, "expire request")
    names = await run_in_threadpool(_scope, backends, caller, asked.namespaces)
    victims = await run_in_threadpool(backends.evictor.expiring, asked.compiler_version, names)
    if asked.dry_run:
        return {"dry_run": True, "compiler_version": asked.compiler_version, **_totals(victims)}
    applied = await run_in_threadpool(backends.evictor.apply, victims, caller.label, "expire")
    return {
        "dry_run": False,
        "compiler_version": asked.compiler_version,
        **_applied_view(applied),
    }


@router.get(
    "/audit",
    responses={**json_answer(200, _AUDIT, "the records, newest first"), **errors(*TOKEN)},
)
async def audit(
    caller: CallerDep,
    backends: BackendsDep,
    since: Annotated[float, Query(ge=0, description="epoch seconds")] = 0.0,
    namespace: Annotated[str | None, Query(pattern=f"^{NAMESPACE}$")] = None,
    limit: Annotated[int, Query(ge=1, le=_AUDIT_MAX)] = 1000,
) -> dict[str, Any]:
    """The newest records first. Server-wide records (tokens) are shown to admins of
    every namespace only."""
    caller.require("admin", namespace)
    if namespace is None and "*" not in caller.namespaces:
        # The caller's namespaces, each read on its own, newest first overall.
        found = []
        for name in caller.namespaces:
            found += await run_in_threadpool(backends.audit.query, since, name, limit)
        found.sort(key=lambda r: r.at, reverse=True)
        found = found[:limit]
    else:
        found = await run_in_threadpool(backends.audit.query, since, namespace, limit)
    return {"records": [r.as_json() for r in found]}


# --- views


def _victim_view(victim: Victim) -> dict[str, Any]:
    return {"namespace": victim.stats.namespace, "key": victim.stats.key, **victim_detail(victim)}


def _totals(victims: Sequence[Victim]) -> dict[str, Any]:
    known = [v.stats.facts.compile_seconds for v in victims]
    return {
        "entries": [_victim_view(v) for v in victims],
        "total": {
            "entries": len(victims),
            "bytes": sum(v.stats.facts.size for v in victims),
            "compile_hours": round(sum(s for s in known if s is not None) / 3600, 3),
            "unknown_compile_time": sum(1 for s in known if s is None),
        },
    }


def _plans_view(plans: Sequence[Plan]) -> dict[str, Any]:
    victims = [v for plan in plans for v in plan.victims]
    return {
        "namespaces": [
            {
                "namespace": plan.namespace,
                "entries": plan.entries,
                "bytes": plan.bytes_before,
                "bytes_after": plan.bytes_after,
                "pinned_bytes": plan.pinned_bytes,
                "over_quota_pinned": plan.over_quota_pinned,
            }
            for plan in plans
        ],
        **_totals(victims),
    }


def _applied_view(applied: Applied) -> dict[str, Any]:
    return {**_totals(applied.removed), "skipped": applied.skipped}
