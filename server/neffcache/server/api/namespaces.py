"""``/v1/admin/namespaces``: namespace policies and pins, for admins.

An admin token of a namespace manages that namespace. Reading another namespace
through is a grant of read access to it, so naming a namespace in ``read_through``
also needs admin rights over that namespace. Every change goes to the audit log.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    NAME,
    NUMBER,
    TOKEN,
    Schema,
    array,
    errors,
    json_answer,
    model_schema,
    no_body,
    nullable,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.api.entries import Namespace
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, Conflict, NotFound
from neffcache.server.eviction.pins import KINDS, PIN, Coverage, Pin, check_pin, pins
from neffcache.server.manifest import load_json, validated
from neffcache.server.namespaces import (
    POLICY,
    NamespacePolicy,
    PolicyFields,
    effective,
    parse_fields,
    store_fields,
)

router = APIRouter(prefix="/v1/admin/namespaces")
_BODY_MAX = 64 * 1024

_POLICY_BODY = request_body(PolicyFields)


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Checked by check_pin; the schema states the same.
    kind: str = Field(
        description=f"one of {', '.join(KINDS)}", json_schema_extra={"enum": list(KINDS)}
    )
    value: str = Field(max_length=300, description="the key, address, model or version")
    reason: str = Field("", max_length=500, description="why, for the audit log")


def _policy(**more: Schema) -> Schema:
    """A namespace's effective policy (``NamespacePolicy.view``), with ``more``."""
    fields = {**model_schema(NamespacePolicy)["properties"], **more}
    return {
        "type": "object",
        "required": sorted(fields),
        "properties": fields,
        "additionalProperties": False,
    }


_COUNT = {"type": "integer", "minimum": 0}
_USAGE = obj(
    {
        "entries": _COUNT,
        "bytes": _COUNT,
        "compile_hours": NUMBER,
        "quota_share": nullable(NUMBER),
    }
)
_PIN_FIELDS = {
    "namespace": NAME,
    "kind": {"type": "string", "enum": list(KINDS)},
    "value": {"type": "string"},
    "reason": {"type": "string"},
    "actor": {"type": "string"},
    "at": NUMBER,
}
_PINS = array(obj(_PIN_FIELDS))
# A pin with what it covers now (pins.Coverage): the entries it protects, those it
# matches by label without protecting them, and a note in plain words ("" for none).
_COVERED_PIN = obj(
    {**_PIN_FIELDS, "protects": _COUNT, "unprotected": _COUNT, "note": {"type": "string"}}
)


@router.get(
    "",
    responses={
        **json_answer(200, obj({"namespaces": array(_policy(usage=_USAGE))}), "policy and usage"),
        **errors(*TOKEN),
    },
)
async def list_namespaces(caller: CallerDep, backends: BackendsDep) -> dict[str, Any]:
    """Every namespace with a policy or an entry that the caller administers."""
    caller.require("admin")
    found = await run_in_threadpool(backends.policies.all)
    shown = [p for p in found if caller.covers(p.namespace)]
    views = [await run_in_threadpool(_view, backends, p) for p in shown]
    return {"namespaces": views}


@router.get(
    "/{namespace}",
    responses={
        **json_answer(200, _policy(usage=_USAGE, pins=_PINS), "policy, usage and pins"),
        **errors(*TOKEN),
    },
)
async def show_namespace(
    namespace: Namespace, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("admin", namespace)
    policy = await run_in_threadpool(backends.policies.current, namespace)
    view = await run_in_threadpool(_view, backends, policy)
    view["pins"] = [p.view() for p in await run_in_threadpool(pins, backends.index, namespace)]
    return view


@router.post(
    "/{namespace}",
    status_code=201,
    openapi_extra=_POLICY_BODY,
    responses={
        **json_answer(201, _policy(), "created: the effective policy"),
        **errors(*TOKEN, *BODY, 409, e409="the namespace exists (or changed meanwhile)"),
    },
)
async def create_namespace(
    namespace: Namespace, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("admin", namespace)
    fields, named = parse_fields(await read_body(request, _BODY_MAX))
    chosen = fields.model_dump(mode="json", include=named)
    await run_in_threadpool(_check_policy, backends, caller, namespace, None, chosen)
    created = await run_in_threadpool(store_fields, backends.index, namespace, chosen, create=True)
    if not created:
        raise Conflict(
            f"namespace {namespace!r} exists already; change its settings instead "
            "(neffcache admin namespace set)"
        )
    backends.policies.forget(namespace)
    if chosen.get("trusted_writers_only"):
        await run_in_threadpool(_recount, backends, namespace, None)
    await run_in_threadpool(
        backends.audit.add, caller.label, "namespace.create", namespace, "", set=chosen
    )
    return (await run_in_threadpool(backends.policies.current, namespace)).view()


@router.patch(
    "/{namespace}",
    openapi_extra=_POLICY_BODY,
    responses={
        **json_answer(200, _policy(), "changed: the effective policy"),
        **errors(
            *TOKEN,
            *BODY,
            404,
            409,
            e404="the namespace was never created",
            e409="the namespace keeps changing, or took an untrusted entry meanwhile",
        ),
    },
)
async def change_namespace(
    namespace: Namespace, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("admin", namespace)
    fields, named = parse_fields(await read_body(request, _BODY_MAX))
    if not named:
        raise BadRequest("name at least one setting to change")
    changes = fields.model_dump(mode="json", include=named)
    for _attempt in range(5):
        record = await run_in_threadpool(backends.index.get_record, POLICY, namespace, "")
        if record is None:
            raise NotFound(f"no namespace {namespace!r}; create it first (admin namespace create)")
        before = json.loads(record.value)
        after = {**before, **changes}
        await run_in_threadpool(_check_policy, backends, caller, namespace, before, after)
        # Compare-and-set: a change made meanwhile (another admin, another field) is
        # read again and checked with this one, never overwritten.
        stored = await run_in_threadpool(
            store_fields, backends.index, namespace, after, create=False, replacing=record.value
        )
        if stored:
            break
    else:
        raise Conflict(f"namespace {namespace!r} keeps changing; try again")
    backends.policies.forget(namespace)
    if after.get("trusted_writers_only") and not before.get("trusted_writers_only"):
        await run_in_threadpool(_recount, backends, namespace, record.value)
    # The values in force before, defaults included: "ranking: value -> lru", not null.
    was = effective(namespace, before, backends.settings).model_dump(mode="json")
    old = {name: was[name] for name in changes}
    await run_in_threadpool(
        backends.audit.add, caller.label, "namespace.set", namespace, "", old=old, new=changes
    )
    return (await run_in_threadpool(backends.policies.current, namespace)).view()


def _check_policy(
    backends: Backends,
    caller: Caller,
    namespace: str,
    before: dict[str, Any] | None,
    after: dict[str, Any],
) -> None:
    """Refuse a policy that would let an untrusted writer reach a trusted reader, or
    grant reads the caller could not grant. Checked on the whole resulting policy, so
    the order in which fields are changed makes no difference."""
    settings = backends.settings
    old = effective(namespace, before, settings)
    new = effective(namespace, after, settings)
    if namespace in new.read_through:
        raise BadRequest("a namespace cannot read through itself")
    for source in set(new.read_through) - set(old.read_through):
        # Read-through grants this namespace's readers read access to the source.
        caller.require("admin", source)
    policies = backends.policies
    if new.trusted_writers_only:
        open_ = [s for s in new.read_through if not policies.current(s).trusted_writers_only]
        if open_:
            raise BadRequest(
                f"namespace {namespace!r} takes only trusted writers, so it may read through "
                f"only namespaces that do too; not {', '.join(open_)}"
            )
        if not old.trusted_writers_only:
            _require_empty(backends, namespace)
    elif old.trusted_writers_only:
        readers = [
            p.namespace
            for p in policies.all()
            if p.trusted_writers_only and namespace in p.read_through
        ]
        if readers:
            raise BadRequest(
                f"namespaces that take only trusted writers read through {namespace!r} "
                f"({', '.join(readers)}): remove it from their read_through first"
            )


def _recount(backends: Backends, namespace: str, before: str | None) -> None:
    """After the rule is stored: an untrusted publish checked before it may have
    landed since. Each untrusted publish checks the rule again after its write and
    takes itself back; one whose second check came before this store is counted here,
    and the change is undone."""
    if not _untrusted_entries(backends, namespace):
        return
    if before is None:
        backends.index.delete_record(POLICY, namespace, "")
    else:
        store_fields(backends.index, namespace, json.loads(before), create=False)
    backends.policies.forget(namespace)
    raise Conflict(
        f"an untrusted publish into {namespace!r} landed while it became trusted-writers-only; "
        "the change is undone (the namespace is no longer empty)"
    )


def _require_empty(backends: Backends, namespace: str) -> None:
    """A namespace turns trusted-writers-only only while it holds no entry: it would
    vouch for what any writer put there, entries and also the aliases any writer may
    have added to a trusted entry (aliases carry no writer)."""
    held = next(iter(backends.evictor.stats(namespace)), None)
    if held is not None:
        raise BadRequest(
            f"namespace {namespace!r} holds entries: a namespace takes only trusted writers "
            "from its creation, or from a moment it is empty (create a new one with "
            "--trusted-writers-only, or expire what it holds)"
        )


def _untrusted_entries(backends: Backends, namespace: str) -> int:
    trusted = backends.evictor.trusted_writers()
    return sum(1 for e in backends.evictor.stats(namespace) if e.writer not in trusted)


def _view(backends: Backends, policy: NamespacePolicy) -> dict[str, Any]:
    """A policy with what the namespace holds now."""
    view = policy.view()
    held = backends.evictor.usage(policy.namespace)
    quota = policy.quota_bytes
    view["usage"] = {
        "entries": held.entries,
        "bytes": held.bytes,
        "compile_hours": round(held.compile_seconds / 3600, 3),
        "quota_share": None if quota is None else held.bytes / quota,
    }
    return view


# --- pins


@router.get(
    "/{namespace}/pins",
    responses={
        **json_answer(200, obj({"pins": array(_COVERED_PIN)}), "the pins, with what each covers"),
        **errors(*TOKEN),
    },
)
async def list_pins(
    namespace: Namespace, caller: CallerDep, backends: BackendsDep
) -> dict[str, Any]:
    caller.require("admin", namespace)
    return {"pins": await run_in_threadpool(_covered, backends, namespace)}


@router.put(
    "/{namespace}/pins",
    status_code=201,
    response_class=Response,
    openapi_extra=request_body(PinRequest),
    responses={
        **json_answer(201, _COVERED_PIN, "pinned: the pin and what it covers now"),
        **json_answer(
            200,
            obj({"detail": {"type": "string"}}, _COVERED_PIN["properties"]),
            "pinned already: the pin as made then, and what it covers now",
        ),
        **errors(*TOKEN, *BODY),
    },
)
async def add_pin(
    namespace: Namespace, request: Request, caller: CallerDep, backends: BackendsDep
) -> Response:
    caller.require("admin", namespace)
    asked = validated(PinRequest, load_json(await read_body(request, _BODY_MAX), "pin"), "pin")
    check_pin(asked.kind, asked.value)
    pin = Pin(namespace, asked.kind, asked.value, asked.reason, caller.label, time.time())
    stored = await run_in_threadpool(backends.index.put_record, pin.record(), create_only=True)
    if stored:
        await run_in_threadpool(
            backends.audit.add, caller.label, "pin", namespace, pin.name, reason=asked.reason
        )
    covered = await run_in_threadpool(_covered, backends, namespace)
    # Unpinned meanwhile (another admin): what it covered was nothing.
    body = next(
        (v for v in covered if (v["kind"], v["value"]) == (pin.kind, pin.value)),
        {**pin.view(), **Coverage().view(pin)},
    )
    if not stored:
        body["detail"] = f"{pin.name} is pinned already"
    status = 201 if stored else 200
    return Response(_json(body), status_code=status, media_type="application/json")


@router.delete(
    "/{namespace}/pins",
    status_code=204,
    responses={**no_body(204, "unpinned"), **errors(*TOKEN, 404, e404="no such pin")},
)
async def remove_pin(
    namespace: Namespace,
    caller: CallerDep,
    backends: BackendsDep,
    kind: Annotated[str, Query(json_schema_extra={"enum": list(KINDS)})],
    value: Annotated[str, Query(max_length=300)],
    reason: Annotated[str, Query(max_length=500)] = "",
) -> Response:
    caller.require("admin", namespace)
    check_pin(kind, value)
    name = f"{kind}:{value}"
    removed = await run_in_threadpool(backends.index.delete_record, PIN, namespace, name)
    if not removed:
        raise NotFound(f"no pin {name} in namespace {namespace!r}")
    await run_in_threadpool(
        backends.audit.add, caller.label, "unpin", namespace, name, reason=reason
    )
    return Response(status_code=204)


def _covered(backends: Backends, namespace: str) -> list[dict[str, Any]]:
    """Each pin of the namespace with what it covers now: one pass over the
    namespace's entry stats, as an eviction plan reads them (no manifest is read)."""
    pinned = backends.evictor.pinned(namespace)
    found = pinned.coverage(backends.evictor.stats(namespace))
    return [{**p.view(), **found[p.name].view(p)} for p in pinned.pins]


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()
