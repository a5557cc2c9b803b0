"""``/v1/blobs``: content-addressed bytes, shared by every namespace.

A blob is hashed on read until its file is verified, and again whenever the file's
stamp changes (verified.py): a blob up to ``_VERIFY_FIRST`` is hashed before the
response starts (a mismatch is a clean 404); a larger one is hashed as it streams and
its last chunk is held back until the digest matches, so a corrupted blob never
completes a response. Either way the blob is quarantined and the next upload heals it.
A verified, unchanged file is sent unhashed, its last chunk held back until its stamp
is checked once more. What no stamp shows (a disk's rot) the scrub finds, or a client,
which verifies every download and reports a mismatch (``POST .../mismatch``, scrub.py).

With ``accel_redirect_prefix`` set and the filesystem store, a GET that nginx marks
(``X-Neffcache-Accel``) is answered with headers only and ``X-Accel-Redirect`` naming
the blob's file, which nginx sends from the same volume (deploy/nginx/): at once for a
verified, unchanged file; after hashing it in full, off the event loop, for any other,
so a corrupted blob is quarantined and a ``404``, never handed to nginx. A range too:
nginx cuts it from the file.

With ``blob_redirect_seconds`` set and a store that can presign (S3), a whole-blob GET
of at least ``blob_redirect_min_bytes`` is answered with a ``307`` to a presigned URL
once the blob is known to exist: its bytes never pass through the server, which
therefore cannot verify them; the client does (docs/protocol.md). A range is never
redirected: only the server, which hashes the whole blob first, can verify one.

What a read sends is decided in services/blobs.py, and what an upload keeps in
services/uploads.py; this module makes them requests and responses.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import (
    BODY,
    HEX,
    TOKEN,
    array,
    errors,
    json_answer,
    no_body,
    obj,
    request_body,
)
from neffcache.server.api.body import body_chunks, read_body
from neffcache.server.auth import Caller
from neffcache.server.blobs import BlobStore
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, NotFound
from neffcache.server.manifest import HEX64
from neffcache.server.services import blobs as blob_reads
from neffcache.server.services import uploads

router = APIRouter()
log = logging.getLogger("neffcache.server")

Digest = Annotated[str, PathParam(pattern=f"^{HEX64}$")]
_MISSING_MAX = 10_000
_MISSING_BODY_MAX = _MISSING_MAX * 80
# Set by the nginx in front (deploy/nginx/): only its requests may be answered with
# X-Accel-Redirect, so a client that reaches the server directly still gets bytes.
ACCEL_HEADER = "x-neffcache-accel"
_OCTETS = "application/octet-stream"
_Absent = Literal["absent"]  # a blob read that missed (none, or corrupt: quarantined)


class Redirect(Response):
    """``307`` to a presigned URL of the blob; ``size`` is the blob's, for the metrics."""

    def __init__(self, url: str, size: int) -> None:
        # no-store: the URL expires, and a cached redirect would outlive it.
        super().__init__(status_code=307, headers={"Location": url, "Cache-Control": "no-store"})
        self.size = size


class Accel(Response):
    """Headers only, ``X-Accel-Redirect: location``: nginx sends the blob's file with
    these headers (deploy/nginx/ keeps the ETag) and its own length and ranges.
    ``size`` is the blob's, for the metrics."""

    def __init__(self, location: str, digest: str, size: int) -> None:
        headers = _headers(digest, size)
        del headers["Content-Length"]  # this answer's body is empty; nginx's is the file
        headers["X-Accel-Redirect"] = location
        super().__init__(headers=headers, media_type=_OCTETS)
        self.size = size


class FileAnswer(Response):
    """A verified blob's file (``open_verified``), for the HTTP protocol to send itself
    (immediate.py): the head a read's answer has, the body from ``opened``; ``sent()``
    counts it in the metrics once the protocol sends it (it may hand the request back
    to the usual way first, which counts what it answers)."""

    def __init__(self, backends: Backends, digest: str, opened: blob_reads.Opened) -> None:
        super().__init__(headers=_headers(digest, opened.file.size), media_type=_OCTETS)
        self.opened = opened
        self._backends, self._digest = backends, digest

    def sent(self) -> None:
        _counted(self._backends, self._digest, self)


_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.put(
    "/v1/blobs/{digest}",
    status_code=201,
    response_class=Response,
    openapi_extra={"requestBody": {"required": True, "content": _BYTES}},
    responses={
        **no_body(201, "stored"),
        **no_body(200, "already there"),
        **errors(
            *TOKEN,
            408,
            413,
            507,
            e400="no Content-Length, or the body's length or BLAKE3 is not the one announced",
            e413="over max_blob_bytes",
        ),
    },
)
async def put_blob(
    digest: Digest,
    request: Request,
    caller: CallerDep,
    backends: BackendsDep,
    content_length: Annotated[int | None, Header()] = None,
) -> Response:
    caller.require("write")
    created = await uploads.receive_blob(backends, digest, content_length, body_chunks(request))
    return Response(status_code=201 if created else 200)


@router.head(
    "/v1/blobs/{digest}",
    response_class=Response,
    responses={**no_body(200, "the blob is here"), **errors(*TOKEN, 404, e404="no such blob")},
)
async def head_blob(digest: Digest, caller: CallerDep, backends: BackendsDep) -> Response:
    caller.require("read")
    size = await backends.run(backends.blobs.size, digest)
    if size is None:
        raise NotFound(f"no blob {digest}")
    return Response(headers=_headers(digest, size))


@router.get(
    "/v1/blobs/{digest}",
    response_class=Response,
    responses={
        200: {"description": "the blob's bytes", "content": _BYTES},
        206: {"description": "the range asked for", "content": _BYTES},
        307: {"description": "the blob is at the presigned URL in Location (S3, when enabled)"},
        **errors(*TOKEN, 404, 416, e404="no such blob (or a corrupted one, now quarantined)"),
    },
)
async def get_blob(
    digest: Digest,
    caller: CallerDep,
    backends: BackendsDep,
    range_header: Annotated[str | None, Header(alias="range")] = None,
    accel: Annotated[
        str | None,
        Header(alias=ACCEL_HEADER, description="set by nginx in front (accel_redirect_prefix)"),
    ] = None,
) -> Response:
    return await answer_blob(backends, caller, digest, range_header, accel is not None)


async def answer_blob(
    backends: Backends,
    caller: Caller,
    digest: str,
    range_header: str | None,
    accel: bool = False,
) -> Response:
    """``GET /v1/blobs/{digest}`` for a validated digest (the route and the fast path);
    ``accel``: the request came through nginx, which can send the file itself."""
    caller.require("read")
    # A range hashes the whole blob first: too long for the event loop, whatever the store.
    run = run_in_threadpool if range_header else backends.run
    response: Response | _Absent | None = await _accel_response(backends, digest) if accel else None
    if response is None:
        found = await run(blob_reads.read, backends, digest, range_header)
        response = "absent" if found is None else _response(backends, digest, found)
    return _counted(backends, digest, response)


def accel_answer(backends: Backends, caller: Caller, digest: str) -> Response | None:
    """``answer_blob``'s answer to a request through nginx, made in the calling thread
    (it may block on the stores), for the protocol's immediate answers (immediate.py):
    None when the usual way must answer it (no accel prefix, no files, or a file not
    verified since it changed, which the usual way hashes first in a worker thread)."""
    caller.require("read")
    target = _accel_target(backends)
    if target is None:
        return None
    found = blob_reads.accel_file(backends, digest, *target, False)
    if found == "unverified":
        return None
    response = found if isinstance(found, str) else Accel(found.location, digest, found.size)
    return _counted(backends, digest, response)


def file_answer(backends: Backends, caller: Caller, digest: str) -> Response | None:
    """``answer_blob``'s answer to a plain GET (no range, no nginx in front) when the
    blob's verified file can be sent as it is (``open_verified``), for the protocol's
    immediate answers; None for the usual read."""
    caller.require("read")
    opened = blob_reads.open_verified(backends, digest)
    return None if opened is None else FileAnswer(backends, digest, opened)


def _counted(backends: Backends, digest: str, response: Response | _Absent) -> Response:
    """The answer to a blob read, counted in the metrics; ``absent`` is a 404."""
    metrics = backends.metrics
    if response == "absent":
        metrics.blob_reads.labels("miss").inc()
        raise NotFound(f"no blob {digest}")
    assert isinstance(response, Response)
    metrics.blob_reads.labels("hit").inc()
    if isinstance(response, Redirect):
        metrics.blob_redirects.inc()
        metrics.blob_bytes_redirected.inc(response.size)
    elif isinstance(response, Accel):
        metrics.blob_accel.inc()
        metrics.blob_bytes_accel.inc(response.size)
    else:
        metrics.blob_bytes_served.inc(int(response.headers.get("content-length", 0)))
    return response


def _response(backends: Backends, digest: str, found: blob_reads.Read) -> Response:
    if isinstance(found, blob_reads.Presigned):
        return Redirect(found.url, found.size)
    if isinstance(found, blob_reads.Whole):
        headers = _headers(digest, len(found.data))
        return Response(found.data, headers=headers, media_type=_OCTETS)
    headers = _headers(digest, found.end - found.start)
    if found.partial:
        headers["Content-Range"] = f"bytes {found.start}-{found.end - 1}/{found.size}"
    return StreamingResponse(
        # A plain iterator makes Starlette move every step to the thread pool: right
        # for a remote store, a needless hop for a local file in the page cache.
        found.chunks if found.blocking else _async(found.chunks),
        status_code=206 if found.partial else 200,
        headers=headers,
        media_type=_OCTETS,
    )


async def _accel_response(backends: Backends, digest: str) -> Accel | _Absent | None:
    """``X-Accel-Redirect`` to the blob's file when ``accel_redirect_prefix`` is set and
    the store has files; None to serve the blob here. A file not verified since it
    last changed is hashed first, in a worker thread; corrupt, it is quarantined (a
    miss, ``absent``)."""
    target = _accel_target(backends)
    if target is None:
        return None
    accel_file = blob_reads.accel_file
    found = await backends.run(accel_file, backends, digest, *target, False)
    if found == "unverified":
        found = await run_in_threadpool(accel_file, backends, digest, *target, True)
    if isinstance(found, str):
        return None if found == "unverified" else found
    return Accel(found.location, digest, found.size)


def _accel_target(backends: Backends) -> tuple[str, Path] | None:
    """The accel prefix and the store's root, when nginx can send the blobs' files."""
    prefix = backends.settings.accel_redirect_prefix
    root = getattr(backends.blobs, "root", None)
    if prefix is None or not isinstance(root, Path):
        return None
    return prefix, root


async def _async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _headers(digest: str, length: int) -> dict[str, str]:
    return {
        "Content-Length": str(length),
        "ETag": f'"{digest}"',
        "Accept-Ranges": "bytes",
        "Cache-Control": "public, max-age=31536000, immutable",
    }


_RECHECK = obj({"recheck": {"type": "string", "enum": ["queued", "recent", "busy"]}})


@router.post(
    "/v1/blobs/{digest}/mismatch",
    status_code=202,
    responses={
        **json_answer(
            202,
            _RECHECK,
            "queued for a re-verification; recent (one was queued lately) or busy "
            "(too many are): nothing more done",
        ),
        **errors(*TOKEN, 404, e404="no such blob (or quarantined already)"),
    },
)
async def report_mismatch(
    digest: Digest, request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, str]:
    """A client downloaded bytes that do not hash to ``digest``: the server forgets it
    verified the blob and hashes it again in the background (scrub.py ``Rechecks``)."""
    caller.require("read")
    reports = backends.metrics.mismatch_reports
    if await backends.run(backends.blobs.size, digest) is None:
        reports.labels("absent").inc()
        raise NotFound(f"no blob {digest}")
    result: str = request.app.state.integrity.rechecks.report(digest)
    reports.labels(result).inc()
    if result == "queued":
        log.warning("a client found blob %s did not match its digest; verifying it", digest)
    return {"recheck": result}


class MissingRequest(BaseModel):
    digests: list[str] = Field(max_length=_MISSING_MAX)


@router.post(
    "/v1/blobs/missing",
    openapi_extra=request_body(MissingRequest),
    responses={
        **json_answer(200, obj({"missing": array(HEX)}), "the digests the server lacks"),
        **errors(*TOKEN, *BODY),
    },
)
async def missing_blobs(
    request: Request, caller: CallerDep, backends: BackendsDep
) -> dict[str, list[str]]:
    caller.require("read")
    try:
        body = MissingRequest.model_validate_json(await read_body(request, _MISSING_BODY_MAX))
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {exc.errors()[0]['msg']}") from None
    for digest in body.digests:
        if not re.fullmatch(HEX64, digest):
            raise BadRequest(f"{digest!r} is not a 64-hex digest")
    # Asking renews nothing: an upload no entry references lives out its grace from
    # its upload, however often anyone asks about it (else a write token could keep
    # unpublished bytes forever, outside every quota). A publisher that loses that race
    # is told which blobs its manifest misses, and uploads them (api/entries.py).
    missing = await backends.run(_missing, backends.blobs, body.digests)
    return {"missing": missing}


def _missing(blobs: BlobStore, digests: list[str]) -> list[str]:
    return [d for d in dict.fromkeys(digests) if blobs.size(d) is None]
