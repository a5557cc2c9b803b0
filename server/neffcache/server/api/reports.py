"""``GET /v1/reports/cost`` and ``GET /v1/reports/upgrade`` (docs/reports.md).

Both need a read token and cover only namespaces it reads: those asked for (each one
checked), else all of the token's (every namespace for a ``*`` token). ``format``
chooses JSON (the dashboard reads it), CSV, a self-contained HTML page or a plain
table. The price table is loaded when the app starts, so a bad ``price_table`` file
stops the server instead of failing reports later.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from neffcache.server.api.answers import TOKEN, Schema, errors, formats_answer, obj
from neffcache.server.auth import Caller
from neffcache.server.deps import BackendsDep, CallerDep
from neffcache.server.errors import BadRequest
from neffcache.server.manifest import NAMESPACE
from neffcache.server.reports.collect import cost_report, upgrade_report
from neffcache.server.reports.render_html import cost_html, upgrade_html
from neffcache.server.reports.render_text import cost_csv, cost_table, upgrade_csv, upgrade_table
from neffcache.server.reports.window import parse_by, parse_time

MAX_TOP = 1000
# Reports computed at once per replica; more wait their turn. Each one reads every
# event of its window (up to the millions an index keeps, parsed on this process's
# event loop between pages) and holds aggregates of up to tens of MB, and a dashboard
# asks for three a minute: unbounded, a few open dashboards would take the CPU and
# memory that lookups need.
CONCURRENT_REPORTS = 2
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
        **errors(*TOKEN),
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
    async with _gate(request):
        report = await cost_report(backends, start, end, grouping, scope, top)
    return _answer(report, fmt, {"csv": cost_csv, "html": cost_html, "table": cost_table})


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
    async with _gate(request):
        report = await upgrade_report(
            backends,
            to_compiler,
            scope,
            from_compiler=from_compiler,
            active_seconds=window,
            top=top,
            server=server,
        )
    return _answer(report, fmt, {"csv": upgrade_csv, "html": upgrade_html, "table": upgrade_table})


def _gate(request: Request) -> asyncio.Semaphore:
    """The app's bound on reports computed at once, one per event loop (a semaphore
    belongs to the loop it first waits on; tests run an app on several loops). Made
    on first use; nothing awaits between looking and setting."""
    loop = asyncio.get_running_loop()
    found: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = getattr(
        request.app.state, "reports_gate", None
    )
    if found is None or found[0] is not loop:
        found = request.app.state.reports_gate = (loop, asyncio.Semaphore(CONCURRENT_REPORTS))
    return found[1]


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
