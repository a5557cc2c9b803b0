"""``/v1/ns/{namespace}/failures/{key}``: recent failed compiles of a key.

Failure records live beside entries in the index, never in them: a record is never a
cache hit, and nothing here reads or changes an entry.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    FAILURE,
    TOKEN,
    array,
    errors,
    json_answer,
    missed,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.api.entries import Key, Namespace, absent
from neffcache.server.api.rules import require_writer
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.failure import FailureReport, failure_record, parse_failure
from neffcache.server.index import Failure
from neffcache.server.services.publish import check_writer

router = APIRouter()

# The log alone may be far larger than the 64 KiB kept; the rest of a report is small.
_REPORT_MAX = 1 << 20


@router.put(
    "/v1/ns/{namespace}/failures/{key}",
    status_code=201,
    response_class=Response,
    openapi_extra=request_body(FailureReport),
    responses={
        **json_answer(201, FAILURE, "the stored record"),
        **errors(*TOKEN, *BODY, e413="the body is over 1 MiB, or the record over 256 KiB"),
    },
)
async def put_failure(
    namespace: Namespace, key: Key, request: Request, caller: CallerDep, backends: BackendsDep
) -> Response:
    policy = await require_writer(backends, caller, namespace)
    report = parse_failure(await read_body(request, _REPORT_MAX))
    now = time.time()
    record = failure_record(
        report, namespace=namespace, key=key, created_at=now, writer=caller.name
    )
    settings = backends.settings
    failure = Failure(namespace, key, record, now, now + policy.failure_ttl_seconds)
    # A thread even for local stores: a write may wait for another process's lock.
    await run_in_threadpool(_put, backends, caller, failure, settings.failures_per_key)
    return Response(record.encode(), status_code=201, media_type="application/json")


def _put(backends: Backends, caller: Caller, failure: Failure, keep: int) -> None:
    check_writer(backends, caller, failure.namespace)  # again, after the body
    backends.index.put_failure(failure, keep)


@router.get(
    "/v1/ns/{namespace}/failures/{key}",
    response_class=Response,
    responses={
        **json_answer(200, obj({"failures": array(FAILURE, 1)}), "the records, newest first"),
        **errors(*TOKEN),
        **missed("the key has no live failure record"),
    },
)
async def get_failures(
    namespace: Namespace, key: Key, caller: CallerDep, backends: BackendsDep
) -> Response:
    caller.require("read", namespace)
    # Always a worker thread, even for local indexes: the records are the largest
    # answers the index gives, and building them must not hold the event loop.
    return await run_in_threadpool(_failures_response, backends, namespace, key)


def _failures_response(backends: Backends, namespace: str, key: str) -> Response:
    # Sliced: a lowered failures_per_key applies before the key's next write trims it.
    found = backends.index.failures(namespace, key, time.time())
    found = found[: backends.settings.failures_per_key]
    if not found:
        return absent(f"no recent failure of {key} in namespace {namespace}")
    # The records are stored as JSON: join them rather than decode and encode each.
    body = '{"failures":[' + ",".join(f.record for f in found) + "]}"
    return Response(body.encode(), media_type="application/json")
