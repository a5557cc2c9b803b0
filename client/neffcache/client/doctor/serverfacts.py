"""What the server says about itself and the caller, and a round trip through it.

Spoken through the client's ``api.Api`` (the connect timeout and the per-request
deadline of ``NEFFCACHE_CONNECT_TIMEOUT`` and ``NEFFCACHE_TIMEOUT``), but not through
``remote.Remote``: trouble here must be reported, not turned into a miss, and must not
mark the server down for every process of the host.

``GET /v1/status?namespace=NS`` tells the server's version, auth mode and clock, the
caller's token (scope, namespaces, trusted) and the namespace (policy, usage). A
server older than that route answers 404: then ``/healthz`` says whether it is up,
and the round trip's answers say what the token may do.

The round trip writes when the token may: one small random blob, and an entry naming
it under a random key in the configured namespace, then reads both back. The
configured namespace rather than a scratch one, because it is the one the job
publishes into: its token, its trusted-writers rule and its quota are what the probe
must meet (a token usually covers that namespace alone anyway). The entry is 64
bytes, labelled with the model ``neffcache-doctor`` so admins can tell it apart;
expiry and quotas treat it as any other.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, NamedTuple

from neffcache.client.api import Api
from neffcache.client.config import ClientConfig
from neffcache.client.http import REDIRECTS, HttpError, Response, error_detail
from neffcache.protocol import routes

PROBE_MODEL = "neffcache-doctor"
PROBE_FILE = "neffcache-doctor-probe"
PROBE_BYTES = 64


class ServerStatus(NamedTuple):
    """``state``: ``ok`` (``/v1/status`` answered), ``old`` (no such route, ``/healthz``
    answered), ``unauthorized`` (401), ``forbidden`` (403), ``down`` (no answer) or
    ``error`` (an answer that makes no sense); ``detail`` says it in one line."""

    state: str
    detail: str
    body: dict[str, Any]
    skew: float | None = None  # server clock minus ours, seconds
    uncertainty: float | None = None  # half the request's round trip
    seconds: float = 0.0


class RoundTrip(NamedTuple):
    """``read``: ``ok``, ``unauthorized``, ``forbidden``, ``error`` or ``down``;
    ``write``: ``ok``, ``read-only`` (the token may not write), ``refused`` (the
    namespace refused the entry: trusted writers, quota), ``skipped``, ``error``."""

    read: str
    write: str
    detail: str
    timings: dict[str, float]
    key: str | None = None


def open_api(config: ClientConfig) -> Api:
    """The API of the configured server and namespace; close it when done."""
    return Api.open(
        config.server,
        config.namespace,
        config.token,
        connect_timeout=config.connect_timeout,
        timeout=config.timeout,
    )


def detail_of(response: Response) -> str:
    """The server's ``detail``, one line."""
    return error_detail(response.body)


def status(config: ClientConfig, api: Api) -> ServerStatus:
    """The server's status with the namespace's part; when the token may not read the
    namespace (403), the status without it, so the token can still be described."""
    found = _status(config, api, api.status_path())
    if found.state != "forbidden":
        return found
    bare = _status(config, api, api.status_path(namespace=False))
    if bare.state != "ok":
        return found
    return bare._replace(detail=f"namespace {config.namespace}: {found.detail}")


def _status(config: ClientConfig, api: Api, path: str) -> ServerStatus:
    before = time.time()
    began = time.monotonic()
    try:
        answer = api.get(path)
    except HttpError as exc:
        return ServerStatus("down", f"no answer from {config.server}: {exc}", {})
    after = time.time()
    seconds = time.monotonic() - began
    if answer.status == 404:
        return _old(config, api, seconds)
    if answer.status != 200:
        state = {401: "unauthorized", 403: "forbidden"}.get(answer.status, "error")
        return ServerStatus(
            state, f"HTTP {answer.status}: {detail_of(answer)}", {}, None, None, seconds
        )
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return ServerStatus("error", "/v1/status answered no JSON object", {}, None, None, seconds)
    server = body.get("server")
    server_time = server.get("time") if isinstance(server, dict) else None
    skew = uncertainty = None
    if isinstance(server_time, (int, float)) and not isinstance(server_time, bool):
        skew = float(server_time) - (before + after) / 2
        uncertainty = (after - before) / 2
    return ServerStatus("ok", "", body, skew, uncertainty, seconds)


def _old(config: ClientConfig, api: Api, seconds: float) -> ServerStatus:
    try:
        answer = api.get("/healthz", auth=False)
    except HttpError as exc:
        return ServerStatus("down", f"no answer from {config.server}/healthz: {exc}", {})
    if answer.status != 200:
        return ServerStatus(
            "error", f"/healthz answered HTTP {answer.status}", {}, None, None, seconds
        )
    return ServerStatus(
        "old", "no /v1/status (a server older than this client)", {}, None, None, seconds
    )


def round_trip(config: ClientConfig, api: Api, may_write: bool | None) -> RoundTrip:
    """Look up an absent key; then, unless ``may_write`` is False, upload, publish and
    read back. ``may_write`` None: unknown (an older server), so the write is tried
    and a refusal is the answer."""
    timings: dict[str, float] = {}
    key = os.urandom(32).hex()
    read, detail = _timed(timings, "lookup", lambda: _lookup(config, api, key))
    if read != "ok":
        return RoundTrip(read, "skipped", detail, timings)
    if may_write is False:
        return RoundTrip(
            "ok", "skipped", "read-only: a lookup of an absent key answered 404", timings
        )
    write, detail = _write(config, api, key, timings)
    return RoundTrip("ok", write, detail, timings, key if write == "ok" else None)


def _timed(timings: dict[str, float], name: str, step: Any) -> Any:
    began = time.monotonic()
    try:
        return step()
    finally:
        timings[name] = round(time.monotonic() - began, 4)


def _lookup(config: ClientConfig, api: Api, key: str) -> tuple[str, str]:
    try:
        answer = api.get(routes.entry_path(config.namespace, key))
    except HttpError as exc:
        return "down", f"lookup: {exc}"
    if answer.status == 404:
        return "ok", "a lookup of an absent key answered 404"
    kinds = {401: "unauthorized", 403: "forbidden"}
    return kinds.get(answer.status, "error"), f"lookup: HTTP {answer.status}: {detail_of(answer)}"


def _write(config: ClientConfig, api: Api, key: str, timings: dict[str, float]) -> tuple[str, str]:
    import blake3

    data = os.urandom(PROBE_BYTES)
    digest = blake3.blake3(data).hexdigest()
    steps = (
        ("upload", lambda: _upload(config, api, digest, data)),
        ("publish", lambda: _publish(config, api, key, digest)),
        ("read back", lambda: _read_back(config, api, key, digest, data)),
    )
    for name, step in steps:
        outcome, detail = _timed(timings, name, step)
        if outcome != "ok":
            return outcome, f"{name}: {detail}"
    spent = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in timings.items())
    return "ok", f"uploaded, published and read back {PROBE_BYTES} bytes ({spent})"


def _upload(config: ClientConfig, api: Api, digest: str, data: bytes) -> tuple[str, str]:
    try:
        answer = api.request(
            "PUT",
            routes.blob_path(digest),
            headers={"Content-Type": "application/octet-stream"},
            body=data,
        )
    except HttpError as exc:
        return "error", str(exc)
    if answer.status in (200, 201):
        return "ok", ""
    if answer.status == 403:
        return "read-only", detail_of(answer)
    return "error", f"HTTP {answer.status}: {detail_of(answer)}"


def _publish(config: ClientConfig, api: Api, key: str, digest: str) -> tuple[str, str]:
    # docs/protocol.md: a manifest needs its key and at least one file whose blob the
    # server holds with that size; the rest is optional.
    manifest = {
        "key": key,
        "files": {PROBE_FILE: {"digest": digest, "size": PROBE_BYTES}},
        "model": PROBE_MODEL,
    }
    try:
        answer = api.request("PUT", routes.entry_path(config.namespace, key), json_body=manifest)
    except HttpError as exc:
        return "error", str(exc)
    if answer.status in (200, 201):
        return "ok", ""
    if answer.status in (403, 413, 507):
        return "refused", f"HTTP {answer.status}: {detail_of(answer)}"
    return "error", f"HTTP {answer.status}: {detail_of(answer)}"


def _read_back(
    config: ClientConfig, api: Api, key: str, digest: str, data: bytes
) -> tuple[str, str]:
    try:
        entry = api.get(routes.entry_path(config.namespace, key))
        if entry.status != 200:
            return "error", f"the entry just published answered HTTP {entry.status}"
        files = json.loads(entry.body).get("files", {})
        if files.get(PROBE_FILE) != {"digest": digest, "size": PROBE_BYTES}:
            return "error", "the entry read back names other files than were published"
        blob = api.get(routes.blob_path(digest))
    except (HttpError, ValueError, AttributeError) as exc:
        return "error", str(exc)
    if blob.status in REDIRECTS:
        return "ok", "the blob is redirected to the store (not followed here)"
    if blob.status != 200 or blob.body != data:
        return "error", f"the blob read back differs (HTTP {blob.status}, {len(blob.body)} bytes)"
    return "ok", ""
