"""The dashboard's routes without a browser: the page, its assets, their headers, and
what an asset URL cannot reach."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from neffcache.server.api.dashboard import CSP, IMMUTABLE, REVALIDATE
from neffcache.server.app import create_app
from neffcache.server.dashboard.page import Asset, load, render_page
from neffcache.server.explain.reasons import REASONS
from neffcache.server.settings import ServerSettings

PACKAGE = resources.files("neffcache.server.dashboard")
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # The app opens its own stores under tmp_path, and closes them.
    with TestClient(create_app(ServerSettings(data_dir=tmp_path))) as test_client:
        yield test_client


def page_references(page: str) -> dict[str, str]:
    """Asset name -> the ``v`` of each ``/assets/...`` URL the page names."""
    found = re.findall(r'"/assets/([^"?]+)\?v=([0-9a-f]+)"', page)
    assert len(found) == len(re.findall(r"/assets/", page)), "an unversioned asset URL"
    return dict(found)


def test_the_page_is_html_with_a_same_origin_policy(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["cache-control"] == REVALIDATE
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.text.startswith("<!doctype html>")
    assert "{{" not in response.text


def test_the_policy_names_no_other_origin() -> None:
    directives = dict(d.split(" ", 1) for d in CSP.split("; "))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "img-src", "connect-src"):
        assert directives[name] == "'self'", name
    assert directives["frame-ancestors"] == "'none'"
    # No host, scheme, wildcard, inline code or eval anywhere.
    assert set(" ".join(directives.values()).split()) == {"'self'", "'none'"}


def test_the_page_names_every_asset_with_its_digest(client: TestClient) -> None:
    references = page_references(client.get("/").text)
    assert set(references) == set(ASSETS)
    for name, version in references.items():
        assert version == load().assets[name].version


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_an_asset_at_the_pages_url_is_kept_for_a_year(client: TestClient, name: str) -> None:
    version = page_references(client.get("/").text)[name]
    response = client.get(f"/assets/{name}", params={"v": version})
    assert response.status_code == 200
    assert response.headers["content-type"] == ASSETS[name]
    assert response.headers["cache-control"] == IMMUTABLE == "public, max-age=31536000, immutable"
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.content == PACKAGE.joinpath(name).read_bytes()
    etag = response.headers["etag"]
    again = client.get(f"/assets/{name}", params={"v": version}, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""


@pytest.mark.parametrize("query", ["", "?v=0123456789abcdef", "?v="])
def test_an_asset_at_another_url_is_revalidated(client: TestClient, query: str) -> None:
    """An old page's URL, or none: the bytes may change with the server, so no year."""
    response = client.get(f"/assets/dashboard.js{query}")
    assert response.status_code == 200
    assert response.headers["cache-control"] == REVALIDATE
    assert response.content == PACKAGE.joinpath("dashboard.js").read_bytes()


@pytest.mark.parametrize(
    "path",
    [
        "/assets/nope.js",
        "/assets/index.html",  # in the package, but the page is served at / only
        "/assets/page.py",
        "/assets/__init__.py",
        "/assets/Dashboard.js",
        "/assets/dashboard.js.map",
        "/assets/.dashboard.js",
        "/assets/",
        "/assets/..%2Fpage.py",
        "/assets/..%2F..%2Fsettings.py",
        "/assets/%2e%2e%2fpage.py",
        "/assets/..%5Cpage.py",
        "/assets/dashboard.js%00.py",
    ],
)
def test_unknown_assets_are_404_and_nothing_else_is_read(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "import" not in response.text  # no Python source came back
    assert response.headers["content-type"].startswith("application/json")


def test_dot_segments_never_reach_a_file(client: TestClient) -> None:
    # Sent as written (httpx would collapse the dots before sending).
    for raw in ("/assets/../api/dashboard.py", "/assets/./../../server/settings.py"):
        response = client.request("GET", raw.replace("..", "%2E%2E"))
        assert response.status_code == 404
        assert "import" not in response.text


def test_no_token_is_needed_for_the_page_or_its_assets(tmp_path: Path) -> None:
    """They hold no data; the page asks for a token when the report API does."""
    settings = ServerSettings(data_dir=tmp_path, bootstrap_admin_token="nfc_boot_secret")
    with TestClient(create_app(settings)) as client:
        assert client.get("/").status_code == 200
        for name, version in page_references(client.get("/").text).items():
            assert client.get(f"/assets/{name}", params={"v": version}).status_code == 200
        assert client.get("/v1/admin/tokens").status_code == 401  # tokens are on


def test_the_page_and_assets_name_no_other_origin() -> None:
    page = load().page.decode()
    texts = {"index.html": page, **{n: a.body.decode() for n, a in load().assets.items()}}
    for name, text in texts.items():
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+", text))
        # The SVG namespace is a name, never fetched.
        assert urls <= {"http://www.w3.org"}, (name, urls)
        assert "@import" not in text
        assert "url(" not in text
    assert "fetch(" in texts["dashboard.js"]
    assert re.findall(r"fetch\(([^,]+),", texts["dashboard.js"]) == [
        '"/v1/reports/cost?" + query',
        '"/v1/status"',
    ]


def test_the_page_carries_the_reason_codes() -> None:
    page = load().page.decode()
    block = re.search(r'<script type="application/json" id="reasons">(.*?)</script>', page, re.S)
    assert block is not None
    assert json.loads(block[1]) == dict(REASONS)
    # The only other scripts are the server's own file: nothing inline to run.
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert [(attrs, body) for attrs, body in scripts if "application/json" not in attrs] == [
        (f' src="/assets/dashboard.js?v={load().assets["dashboard.js"].version}" defer', "")
    ]


def test_every_chart_has_a_caption_and_a_table() -> None:
    page = load().page.decode()
    charts = re.findall(r'<div id="([a-z-]+)-chart" class="chart">', page)
    assert charts == ["hit-rate", "hours", "namespaces", "models", "reasons", "storage"]
    for chart in charts:
        section = page[page.index(f'id="{chart}-chart"') :]
        section = section[: section.index("</section>")]
        assert "<figcaption>" in section, chart
        assert f'<table id="{chart}-table"' in section, chart
        assert "<caption>" in section, chart


def test_a_page_naming_a_missing_asset_is_refused() -> None:
    assets = {"dashboard.js": Asset(b"", "text/javascript; charset=utf-8", "0" * 16)}
    assert '"/assets/dashboard.js?v=0000000000000000"' in render_page(
        '<script src="/assets/dashboard.js"></script>', assets
    )
    with pytest.raises(LookupError, match=r"gone\.css"):
        render_page('<link href="/assets/gone.css">', assets)


def test_a_reason_meaning_cannot_close_the_data_block(monkeypatch: pytest.MonkeyPatch) -> None:
    from neffcache.server.dashboard import page as page_module

    monkeypatch.setattr(page_module, "REASONS", {"x": "</script><script>alert(1)</script>"})
    rendered = render_page("{{reasons}}", {})
    assert "</script>" not in rendered
    assert json.loads(rendered) == {"x": "</script><script>alert(1)</script>"}
