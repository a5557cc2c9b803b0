"""``/healthz`` (the process is up) and ``/readyz`` (its backends answer)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from neffcache.server.deps import BackendsDep
from neffcache.server.errors import StoreError

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
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
