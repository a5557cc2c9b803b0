"""``/healthz`` (the process is up), ``/readyz`` (its backends answer) and
``/metrics`` (Prometheus; metrics.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import errors, json_answer, obj
from neffcache.server.deps import BackendsDep, authenticate_request
from neffcache.server.errors import Forbidden, StoreError

router = APIRouter()


_READY = obj({"status": {"type": "string", "enum": ["ready"]}})
_UNAVAILABLE = obj(
    {
        "status": {"type": "string", "enum": ["unavailable"]},
        "problems": {"type": "object", "additionalProperties": {"type": "string"}},
    }
)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    # On the event loop, never a worker thread: the process is up when its loop is,
    # whatever keeps the thread pool busy.
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        **json_answer(200, _READY, "the blob store and the index answer"),
        **json_answer(503, _UNAVAILABLE, "a store does not answer; problems says which"),
    },
)
def readyz(backends: BackendsDep) -> JSONResponse:
    problems = {}
    for name, store in (("blobs", backends.blobs), ("index", backends.index)):
        try:
            store.check()
        except StoreError as exc:
            problems[name] = str(exc)
    if problems:
        return JSONResponse({"status": "unavailable", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses=errors(401, 403),
)
async def metrics(
    backends: BackendsDep, authorization: Annotated[str | None, Header()] = None
) -> Response:
    """Prometheus text format: counts and namespace names only, never keys, digests or
    tokens. Without a token (as scrapers expect), unless ``metrics_require_token``:
    then only a token for every namespace, since the names of all of them show."""
    if backends.settings.metrics_require_token:
        caller = await authenticate_request(backends, authorization)
        if not caller.covers("*"):
            raise Forbidden("/metrics names every namespace: it needs a token for '*'")
    body = await run_in_threadpool(backends.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
