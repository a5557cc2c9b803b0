"""``/v1/ns/{namespace}/entries`` and ``/aliases``: immutable manifests per namespace
(the publish rules are services/publish.py)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from neffcache.protocol import inline, is_alias
from neffcache.server.api.answers import (
    BODY,
    ENTRY,
    HEX,
    TOKEN,
    Answers,
    array,
    errors,
    formats_answer,
    json_answer,
    missed,
    no_body,
    nullable,
    obj,
    request_body,
)
from neffcache.server.api.body import read_body
from neffcache.server.api.rules import require_writer
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest, Conflict
from neffcache.server.explain.notes import note_published
from neffcache.server.index import Entry, PutResult
from neffcache.server.lookup import find_alias, find_entry, inlined_file, stamped
from neffcache.server.manifest import HEX64, NAMESPACE, Manifest, parse_manifest
from neffcache.server.services import publish

router = APIRouter()

Namespace = Annotated[str, PathParam(pattern=f"^{NAMESPACE}$")]
Key = Annotated[str, PathParam(pattern=f"^{HEX64}$")]
_MANIFEST_MAX = 1 << 20
# {"key": "<64 hex>"} and a little room for whitespace.
_ALIAS_BODY_MAX = 1024


@router.put(
    "/v1/ns/{namespace}/entries/{key}",
    status_code=201,
    response_class=Response,
    openapi_extra=request_body(Manifest),
    responses={
        **no_body(201, "published"),
        **no_body(200, "the same manifest was there already"),
        **errors(
            *TOKEN,
            *BODY,
            409,
            503,
            e400="a malformed manifest, or blobs the server lacks (listed in missing)",
            e409="the key holds a different manifest",
            e413="the body is over 1 MiB, or the entry over the namespace's limits",
            e503="a blob it names is being collected: publish again shortly",
        ),
    },
)
async def put_entry(
    namespace: Namespace, key: Key, request: Request, caller: CallerDep, backends: BackendsDep
) -> Response:
    policy = await require_writer(backends, caller, namespace)
    manifest, canonical = parse_manifest(await read_body(request, _MANIFEST_MAX), key)
    publish.check_size(policy, namespace, sum(ref.size for ref in manifest.files.values()))
    result = await run_in_threadpool(
        publish.publish,
        backends,
        caller,
        namespace,
        key,
        manifest.files,
        canonical,
        manifest.aliases(),
    )
    metrics = backends.metrics
    metrics.publishes.labels(metrics.namespace(namespace), result.value).inc()
    if result is PutResult.CONFLICT:
        raise Conflict(f"key {key} already holds a different manifest; entries are immutable")
    if result is PutResult.CREATED:
        # Requests long-polling a lease on this graph (api/leases.py) answer now.
        backends.wakeups.notify(namespace, (key, *manifest.aliases()))
        # The program map learns the entry after the answer (explain/notes.py).
        task = BackgroundTask(note_published, backends.index, backends.blobs, namespace, key)
        return Response(status_code=201, background=task)
    return Response(status_code=200)


_LOOKUP: Answers = {
    **formats_answer(
        200,
        {"application/json": ENTRY, inline.MEDIA_TYPE: {"type": "string", "format": "binary"}},
        "the manifest and the server's stamps; asked for with X-Neffcache-Inline, that JSON"
        " followed by the named file's bytes (docs/protocol.md#a-file-inline)",
    ),
    **errors(*TOKEN),
    **missed("no such entry, here or in the namespaces read through"),
}
# X-Neffcache-Inline: FILE=MAX_BYTES (protocol/inline.py); the routes read it as the
# fast path does.
_Inline = Annotated[str | None, Header(alias=inline.HEADER)]


@router.get("/v1/ns/{namespace}/entries/{key}", response_class=Response, responses=_LOOKUP)
async def get_entry(
    namespace: Namespace,
    key: Key,
    caller: CallerDep,
    backends: BackendsDep,
    x_neffcache_inline: _Inline = None,
) -> Response:
    return await answer_entry(backends, caller, namespace, key, x_neffcache_inline)


async def answer_entry(
    backends: Backends, caller: Caller, namespace: str, key: str, asked: str | None = None
) -> Response:
    """``GET /v1/ns/{namespace}/entries/{key}`` for validated names (route and fast
    path); ``asked``: the request's ``X-Neffcache-Inline``."""
    return await backends.run(entry_answer, backends, caller, namespace, key, asked)


async def answer_alias(
    backends: Backends, caller: Caller, namespace: str, alias: str, asked: str | None = None
) -> Response:
    """``GET /v1/ns/{namespace}/aliases/{alias}`` for a validated namespace (route and
    fast path); an alias that is not one is ``400``."""
    return await backends.run(alias_answer, backends, caller, namespace, alias, asked)


def entry_answer(
    backends: Backends, caller: Caller, namespace: str, key: str, asked: str | None
) -> Response:
    """``answer_entry``'s answer, made in the calling thread (it may block on the
    stores): for the protocol's immediate answers (immediate.py), on local stores."""
    caller.require("read", namespace)
    return _entry_response(backends, namespace, key, asked)


def alias_answer(
    backends: Backends, caller: Caller, namespace: str, alias: str, asked: str | None
) -> Response:
    """``answer_alias``'s answer, made in the calling thread (see ``entry_answer``)."""
    caller.require("read", namespace)
    if not is_alias(alias):
        raise BadRequest(f"{alias!r} is neither a direct key nor a Neuron cache address")
    return _alias_response(backends, namespace, alias, asked)


_ALIAS_LIST = obj({"aliases": array({"type": "string"})})


@router.get(
    "/v1/ns/{namespace}/entries/{key}/aliases",
    response_class=Response,
    responses={
        **json_answer(200, _ALIAS_LIST, "every alias naming the entry, sorted"),
        **errors(*TOKEN),
        **missed("no such entry in the namespace"),
    },
)
async def list_aliases(
    namespace: Namespace, key: Key, caller: CallerDep, backends: BackendsDep
) -> Response:
    """The direct keys and Neuron addresses that name an entry: an export writes a
    stock folder for each address (another trace of the same program had its own)."""
    caller.require("read", namespace)
    return await backends.run(_aliases_response, backends, namespace, key)


def _aliases_response(backends: Backends, namespace: str, key: str) -> Response:
    # This namespace only, as the listing: not the namespaces it reads through.
    if backends.index.get_entry(namespace, key) is None:
        return absent(f"no entry {key} in namespace {namespace}")
    body = json.dumps({"aliases": backends.index.aliases_of(namespace, key)})
    return Response(body.encode(), media_type="application/json")


@router.get("/v1/ns/{namespace}/aliases/{alias:path}", response_class=Response, responses=_LOOKUP)
async def get_alias(
    namespace: Namespace,
    alias: str,
    caller: CallerDep,
    backends: BackendsDep,
    x_neffcache_inline: _Inline = None,
) -> Response:
    return await answer_alias(backends, caller, namespace, alias, x_neffcache_inline)


_ALIAS_BODY = {
    "type": "object",
    "required": ["key"],
    "properties": {"key": HEX},
    "additionalProperties": False,
}


@router.put(
    "/v1/ns/{namespace}/aliases/{alias:path}",
    status_code=201,
    response_class=Response,
    openapi_extra=request_body(_ALIAS_BODY),
    responses={
        **no_body(201, "added"),
        **no_body(200, "the alias names that key already"),
        **errors(*TOKEN, *BODY, 409, e409="the alias names another key"),
        **missed("the namespace has no entry under key"),
    },
)
async def put_alias(
    namespace: Namespace, alias: str, request: Request, caller: CallerDep, backends: BackendsDep
) -> Response:
    """Add an alias to an existing entry (``{"key": KEY}``): a Neuron address or a
    direct key under which a stock cache or another trace found the same program."""
    await require_writer(backends, caller, namespace)
    if not is_alias(alias):
        raise BadRequest(f"{alias!r} is neither a direct key nor a Neuron cache address")
    key = _alias_target(await read_body(request, _ALIAS_BODY_MAX))
    # A thread even for local stores: a write may wait for another process's lock.
    result = await run_in_threadpool(publish.add_alias, backends, caller, namespace, alias, key)
    if result is None:
        return absent(f"no entry {key} in namespace {namespace}")
    if result is PutResult.CONFLICT:
        raise Conflict(f"alias {alias} already names another key; aliases keep their first key")
    if result is PutResult.CREATED:
        backends.wakeups.notify(namespace, (alias,))  # lease waiters on that name
    return Response(status_code=201 if result is PutResult.CREATED else 200)


def _alias_target(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        raise BadRequest('the body must be JSON: {"key": "<64 hex>"}') from None
    if (
        not isinstance(parsed, dict)
        or set(parsed) != {"key"}
        or not isinstance(parsed["key"], str)
        or not re.fullmatch(HEX64, parsed["key"])
    ):
        raise BadRequest('the body must be {"key": "<64 hex>"} and nothing else')
    key: str = parsed["key"]
    return key


def _alias_response(backends: Backends, namespace: str, alias: str, asked: str | None) -> Response:
    entry = find_alias(backends, namespace, alias)
    if entry is None:
        return absent(f"no entry has the alias {alias} in namespace {namespace}")
    return _found(backends, entry, asked)


def _entry_response(backends: Backends, namespace: str, key: str, asked: str | None) -> Response:
    entry = find_entry(backends, namespace, key)
    if entry is None:
        return absent(f"no entry {key} in namespace {namespace}")
    return _found(backends, entry, asked)


def _found(backends: Backends, entry: Entry, asked: str | None) -> Response:
    body = stamped(entry).encode()
    data = None if asked is None else inlined_file(backends, entry, asked)
    return JsonBody(body) if data is None else InlineBody(body, data)


# A lookup's answer depends on the inline ask: a shared cache in front must not give
# one asked for to a client that did not ask.
_VARY = (b"vary", inline.HEADER.encode())


class InlineBody(Response):
    """A lookup's JSON followed by one file's bytes, framed as protocol/inline.py says;
    sent as two writes rather than joined: the file may be megabytes, and the JSON's
    few hundred bytes go out with the head (connections.py joins small writes)."""

    media_type = inline.MEDIA_TYPE

    def __init__(self, body: bytes, data: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = inline.prefix(body) + body
        self.data = data
        self.raw_headers = [
            (b"content-length", b"%d" % (len(self.body) + len(data))),
            (b"content-type", inline.MEDIA_TYPE.encode()),
            _VARY,
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        await send({"type": "http.response.body", "body": self.data})


class JsonBody(Response):
    """A JSON body already encoded, with its two headers made directly: what every
    lookup answers, so Starlette's general header building is skipped (it was a
    twentieth of a lookup's time on one core)."""

    media_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", b"application/json"),
            _VARY,
        ]


def absent(detail: str) -> Response:
    # Why a lookup missed; later reasons (expired, evicted) share this shape.
    return JSONResponse({"detail": detail, "reason": "absent"}, status_code=404)


# --- listing

_LIST_MAX = 1000


_PAGE = obj({"entries": array(ENTRY), "next": nullable(HEX)})


@router.get(
    "/v1/ns/{namespace}/entries",
    response_class=Response,
    responses={**json_answer(200, _PAGE, "a page of entries, by key"), **errors(*TOKEN)},
)
async def list_entries(
    namespace: Namespace,
    caller: CallerDep,
    backends: BackendsDep,
    after: Annotated[str | None, Query(pattern=f"^{HEX64}$")] = None,
    limit: Annotated[int, Query(ge=1, le=_LIST_MAX)] = 100,
) -> Response:
    """A page of a namespace's entries in ascending key order; ``next`` is the
    ``after`` of the following page, or null after the last."""
    caller.require("read", namespace)
    return await backends.run(_list_response, backends, namespace, after, limit)


def _list_response(backends: Backends, namespace: str, after: str | None, limit: int) -> Response:
    # One more than asked: whether a next page exists is known without another request.
    found = backends.index.list_entries(namespace, after, limit + 1)
    page = found[:limit]
    following = page[-1].key if len(found) > limit else None
    body = (
        '{"entries":['
        + ",".join(stamped(entry) for entry in page)
        + '],"next":'
        + json.dumps(following)
        + "}"
    )
    return Response(body.encode(), media_type="application/json")
