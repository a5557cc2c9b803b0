"""``GET /v1/reports/cost`` and ``GET /v1/reports/upgrade`` (docs/reports.md).

Both need a read token and cover only namespaces it reads: those asked for (each one
checked), else all of the token's (every namespace for a ``*`` token). ``format``
chooses JSON (the dashboard reads it), CSV, a self-contained HTML page or a plain
table. The price table is loaded when the app starts, so a bad ``price_table`` file
stops the server instead of failing reports later.

A report is read, folded and rendered in a worker thread, never on the event loop,
one at a time per process with a bounded queue (``reports/gate.py``): a full queue
is a ``503`` with ``Retry-After``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from neffcache.server.api.answers import TOKEN, Schema, errors, formats_answer, obj
from neffcache.server.auth import Caller
from neffcache.server.deps import Backends, BackendsDep, CallerDep
from neffcache.server.errors import BadRequest
from neffcache.server.manifest import NAMESPACE
from neffcache.server.reports.collect import build_cost_report, build_upgrade_report
from neffcache.server.reports.gate import ReportsBusy, gate_of
from neffcache.server.reports.render_html import cost_html, upgrade_html
from neffcache.server.reports.render_text import cost_csv, cost_table, upgrade_csv, upgrade_table
from neffcache.server.reports.window import parse_by, parse_time

MAX_TOP = 1000
# Reports computed at once per replica (one: reports/gate.py says why), and reports
# that may wait their turn, more being refused (503, Retry-After): three dashboards
# loading at once, three reports each.
CONCURRENT_REPORTS = 1
WAITING_REPORTS = 8
_MEDIA = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "table": "text/plain; charset=utf-8",
}
# An HTML report is a self-contained page of client-supplied labels (escaped) served on
# the dashboard's origin: nothing in it may run, load or be framed, whatever slips through.
_HTML_POLICY = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_*-]{0,199}")
P = ParamSpec("P")


router = APIRouter(prefix="/v1/reports")

Format = Annotated[str, Query(alias="format", description="json, csv, html or table")]
Namespaces = Annotated[
    list[str] | None,
    Query(alias="namespace", description="repeat for several; default: all yours"),
]


def _formats(required: tuple[str, ...], what: str) -> Any:
    """The answers of a report route: the report in each format, or an error."""
    text = {"type": "string"}
    schemas: dict[str, Schema] = {
        "application/json": obj({name: {} for name in required}),
        **{media.split(";")[0]: text for fmt, media in _MEDIA.items() if fmt != "json"},
    }
    return {
        **formats_answer(200, schemas, f"the {what} report, in the format asked"),
        **errors(
            *TOKEN, 503, e503=f"{WAITING_REPORTS} reports wait already; Retry-After says when"
        ),
    }


@router.get(
    "/cost",
    response_class=Response,
    responses=_formats(
        (
            "since",
            "until",
            "generated_at",
            "by",
            "currency",
            "totals",
            "rows",
            "days",
            "runs",
            "top_misses",
            "storage",
            "prices",
            "notes",
        ),
        "cost",
    ),
)
async def cost(
    request: Request,
    caller: CallerDep,
    backends: BackendsDep,
    namespaces: Namespaces = None,
    since: Annotated[str, Query(description="7d, epoch seconds or an ISO date")] = "7d",
    until: Annotated[str, Query(description="as since; default now")] = "now",
    by: Annotated[str, Query(description="namespace,model,day,job")] = "namespace",
    top: Annotated[int, Query(ge=0, le=MAX_TOP)] = 10,
    fmt: Format = "json",
) -> Response:
    """Compile-hours and money spent on misses and saved by hits, in the window."""
    _check_format(fmt)
    now = time.time()
    start, end = _time(since, now, "since"), _time(until, now, "until")
    if start >= end:
        raise BadRequest(f"since ({since}) must be before until ({until})")
    try:
        grouping = parse_by(by)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    scope = _scope(caller, namespaces)
    return await _computed(request, _cost, backends, start, end, grouping, scope, top, fmt)


@router.get(
    "/upgrade",
    response_class=Response,
    responses=_formats(
        ("to_compiler", "generated_at", "currency", "totals", "namespaces", "prices"), "upgrade"
    ),
)
async def upgrade(
    request: Request,
    caller: CallerDep,
    backends: BackendsDep,
    to_compiler: Annotated[str, Query(description="the compiler version to upgrade to")],
    namespaces: Namespaces = None,
    from_compiler: Annotated[
        str | None, Query(description="default: the version served most recently")
    ] = None,
    active: Annotated[
        str | None, Query(description="in use if served within this (30d); default: the TTL")
    ] = None,
    top: Annotated[int, Query(ge=0, le=MAX_TOP)] = 20,
    fmt: Format = "json",
) -> Response:
    """Per namespace, the graphs in use that will miss under ``to_compiler``, the
    compile-hours and money to rebuild them, and a prewarm plan."""
    _check_format(fmt)
    for name, value in (("to_compiler", to_compiler), ("from_compiler", from_compiler)):
        if value is not None and not _VERSION.fullmatch(value):
            raise BadRequest(f"{name} {value[:40]!r} is not a compiler version such as 2.21.1.0")
    window = None
    if active is not None:
        now = time.time()
        window = now - _time(active, now, "active")
        if window <= 0:
            raise BadRequest(f"active {active!r}: give a duration such as 30d")
    scope = _scope(caller, namespaces)
    server = str(request.base_url).rstrip("/")
    return await _computed(
        request, _upgrade, backends, to_compiler, scope, from_compiler, window, top, server, fmt
    )


async def _computed(
    request: Request, answer: Callable[P, Response], *args: P.args, **kwargs: P.kwargs
) -> Response:
    """``answer(*args, **kwargs)`` in a worker thread, when this report's turn comes."""
    gate = gate_of(request.app.state, CONCURRENT_REPORTS, WAITING_REPORTS)
    try:
        async with gate.turn():
            return await run_in_threadpool(answer, *args, **kwargs)
    except ReportsBusy as busy:
        headers = {"Retry-After": str(busy.retry_after)}
        return JSONResponse({"detail": str(busy)}, status_code=503, headers=headers)


def _cost(
    backends: Backends,
    since: float,
    until: float,
    by: tuple[str, ...],
    scope: list[str] | None,
    top: int,
    fmt: str,
) -> Response:
    report = build_cost_report(backends, since, until, by, scope, top)
    return _answer(report, fmt, {"csv": cost_csv, "html": cost_html, "table": cost_table})


def _upgrade(
    backends: Backends,
    to_compiler: str,
    scope: list[str] | None,
    from_compiler: str | None,
    window: float | None,
    top: int,
    server: str,
    fmt: str,
) -> Response:
    report = build_upgrade_report(
        backends,
        to_compiler,
        scope,
        from_compiler=from_compiler,
        active_seconds=window,
        top=top,
        server=server,
    )
    return _answer(report, fmt, {"csv": upgrade_csv, "html": upgrade_html, "table": upgrade_table})


def _check_format(fmt: str) -> None:
    if fmt not in _MEDIA:
        raise BadRequest(f"format {fmt[:20]!r} is not one of {', '.join(_MEDIA)}")


def _time(text: str, now: float, what: str) -> float:
    try:
        return parse_time(text, now, what)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _scope(caller: Caller, asked: list[str] | None) -> list[str] | None:
    """The namespaces a report covers: those asked (each one the caller reads), else
    the caller's own; None for every namespace (a ``*`` token)."""
    caller.require("read")
    for namespace in asked or ():
        if not re.fullmatch(NAMESPACE, namespace):
            raise BadRequest(f"{namespace[:80]!r} is not a namespace name")
        caller.require("read", namespace)
    if asked:
        return sorted(set(asked))
    if "*" in caller.namespaces:
        return None
    return sorted(set(caller.namespaces))


def _answer(
    report: dict[str, Any], fmt: str, renderers: dict[str, Callable[[dict[str, Any]], str]]
) -> Response:
    if fmt == "json":
        return JSONResponse(report)
    headers = {"Content-Security-Policy": _HTML_POLICY} if fmt == "html" else None
    return Response(renderers[fmt](report), media_type=_MEDIA[fmt], headers=headers)
