"""The client's one API client (``neffcache.client.api``): what it sends, and that the
paths it builds beyond ``neffcache.protocol.routes`` are routes the server serves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neffcache.client.api import Api, report_path
from neffcache.client.http import Connection, Response

KEY = "a" * 64


class Recording(Connection):
    """A connection that answers 200 and keeps what each request sent."""

    def __init__(self) -> None:
        super().__init__("http://cache.test", 1.0, 1.0)
        self.sent: list[tuple[str, str, dict[str, str], Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Response:  # type: ignore[override]
        self.sent.append((method, path, dict(kwargs.get("headers") or {}), kwargs.get("body")))
        return Response(200, {}, b"{}")


def test_every_request_carries_the_token_and_json_goes_as_json() -> None:
    conn = Recording()
    api = Api(conn, "team-a", "s3cret")
    api.request("PUT", "/v1/x", json_body={"key": KEY})
    method, path, headers, body = conn.sent[-1]
    assert (method, path, body) == ("PUT", "/v1/x", b'{"key": "' + KEY.encode() + b'"}')
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"
    api.get("/healthz", auth=False)
    assert "Authorization" not in conn.sent[-1][2]
    Api(conn, "team-a", None).get("/v1/status")
    assert "Authorization" not in conn.sent[-1][2]


def test_the_query_paths() -> None:
    api = Api(Recording(), "team-a", None)
    assert api.status_path() == "/v1/status?namespace=team-a"
    assert api.status_path(namespace=False) == "/v1/status"
    assert api.status_path(window=86400.0) == "/v1/status?namespace=team-a&window=86400"
    assert api.entries_page_path(10, KEY) == f"/v1/ns/team-a/entries?limit=10&after={KEY}"
    assert report_path("cost", {"namespace": ["a", "b"], "top": 3}) == (
        "/v1/reports/cost?namespace=a&namespace=b&top=3"
    )


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from neffcache.server.app import create_app
    from neffcache.server.blobs.memory import MemoryBlobStore
    from neffcache.server.index.memory import MemoryIndex
    from neffcache.server.settings import ServerSettings

    data: Path = tmp_path_factory.mktemp("data")
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        app = create_app(ServerSettings(data_dir=data), blob_store=blobs, index=index)
        yield app.openapi()
    finally:
        blobs.close()
        index.close()


def _served(openapi: dict[str, Any], method: str, path: str) -> bool:
    """Whether ``method path`` (its query left out) fills one of the served templates."""
    bare = path.partition("?")[0]
    for template, methods in openapi["paths"].items():
        pattern = re.sub(r"\\\{[a-z_]+(:path)?\\\}", "[^?]+", re.escape(template))
        if re.fullmatch(pattern, bare) and method.lower() in methods:
            return True
    return False


def test_the_paths_it_builds_are_served(openapi: dict[str, Any]) -> None:
    api = Api(Recording(), "team-a", None)
    for method, path in (
        ("GET", api.status_path()),
        ("GET", api.explain_key_path(KEY)),
        ("GET", api.entry_aliases_path(KEY)),
        ("GET", api.entries_page_path(10)),
        ("GET", report_path("cost", {})),
        ("GET", report_path("upgrade", {})),
    ):
        assert _served(openapi, method, path), path
    assert not _served(openapi, "GET", "/v1/ns/team-a/nothing")  # the check can fail
