"""``GET /``, the dashboard page, and ``GET /assets/{name}``, its script, stylesheet
and icon (``dashboard/``). No token: they hold no data; the page asks the report API
(``/v1/reports/cost``) with the token the user gives it.

Every answer carries a Content-Security-Policy that allows only this origin, so the
page can neither load nor send anything elsewhere. Assets named with the page's
``?v=DIGEST`` are the same bytes forever and are cached for a year; any other asset
URL, and the page itself, are revalidated on every use.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from neffcache.server.dashboard.page import load
from neffcache.server.errors import NotFound

router = APIRouter(include_in_schema=False)

CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",  # the token form is handled by the script, never submitted
        "frame-ancestors 'none'",
    )
)
_SECURITY = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


@router.get("/")
def page() -> Response:
    headers = {**_SECURITY, "Cache-Control": REVALIDATE}
    return Response(load().page, media_type="text/html; charset=utf-8", headers=headers)


@router.get("/assets/{name}")
def asset(name: str, request: Request) -> Response:
    found = load().assets.get(name)
    if found is None:
        raise NotFound(f"no dashboard asset {name!r}")
    current = request.query_params.get("v") == found.version
    headers = {
        **_SECURITY,
        "Cache-Control": IMMUTABLE if current else REVALIDATE,
        "ETag": found.etag,
    }
    if request.headers.get("if-none-match") == found.etag:
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type=found.content_type, headers=headers)
