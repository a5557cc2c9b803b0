"""``/healthz`` (the process is up), ``/readyz`` (its backends answer) and
``/metrics`` (Prometheus; metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import json_answer, obj
from neffcache.server.deps import BackendsDep
from neffcache.server.errors import StoreError

router = APIRouter()


_READY = obj({"status": {"type": "string", "enum": ["ready"]}})
_UNAVAILABLE = obj(
    {
        "status": {"type": "string", "enum": ["unavailable"]},
        "problems": {"type": "object", "additionalProperties": {"type": "string"}},
    }
)


@router.get("/healthz")
def healthz() -> dict[str, str]:
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


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(backends: BackendsDep) -> Response:
    """Prometheus text format, without a token (as scrapers expect): counts and
    namespace names only, never keys, digests or tokens."""
    body = await run_in_threadpool(backends.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
