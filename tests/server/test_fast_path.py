"""The fast path (server/fastpath.py) answers blob, entry and alias GETs before FastAPI's
middleware and routing, and answers them exactly as the routes do: the same status,
body and headers for a hit, a miss, a bad token and a range, with the fast path off
(every request through FastAPI) and on. Everything else still goes through FastAPI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.api import KEY, admin_token, digest, make_token, publish

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    blobs = MemoryBlobStore()
    app = create_app(
        ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0),
        blob_store=blobs,
        index=MemoryIndex(),
    )
    try:
        with TestClient(app) as test_client:
            yield test_client
    finally:
        blobs.close()


class Counting:
    """Stands in for the app's middleware stack: counts what reaches FastAPI."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope.get("path", scope["type"]))
        await self.inner(scope, receive, send)


def answers(client: TestClient, requests: list[tuple[str, dict[str, str]]]) -> list[Any]:
    out = []
    for path, headers in requests:
        got = client.get(path, headers=headers)
        kept = {k: v for k, v in got.headers.items() if k not in ("date", "server")}
        out.append((got.status_code, got.content, kept))
    return out


def test_the_fast_path_answers_as_the_routes_do(client: TestClient) -> None:
    body = publish(client)
    admin = admin_token(client)
    # Once a token exists, requests need one (docs/protocol.md).
    reader = {"Authorization": f"Bearer {make_token(client, admin, 'read', ['team-a'])}"}
    other = make_token(client, admin, "read", ["team-b"])
    blob = body["files"]["model.neff"]["digest"]
    requests = [
        (f"/v1/ns/team-a/entries/{KEY}", reader),
        (f"/v1/ns/team-a/entries/{'b' * 64}", reader),  # a miss
        (f"/v1/ns/team-a/entries/{KEY}", {"Authorization": "Bearer nfc_nonsense"}),
        (f"/v1/ns/team-a/entries/{KEY}", {"Authorization": f"Bearer {other}"}),
        (f"/v1/blobs/{blob}", reader),
        (f"/v1/blobs/{blob}", {**reader, "Range": "bytes=2-5"}),
        (f"/v1/blobs/{digest(b'never stored')}", reader),
    ]
    app = client.app
    fast = app.fast_path  # type: ignore[attr-defined]
    assert fast is not None
    on = answers(client, requests)
    app.fast_path = None  # type: ignore[attr-defined]
    try:
        off = answers(client, requests)
    finally:
        app.fast_path = fast  # type: ignore[attr-defined]
    assert [status for status, _, _ in on] == [200, 404, 401, 403, 200, 206, 404]
    assert on == off


def test_lookups_and_blob_reads_skip_fastapi_and_the_rest_do_not(client: TestClient) -> None:
    body = publish(client)
    app: Any = client.app
    assert app.middleware_stack is not None  # built at start-up (the lifespan)
    counting = Counting(app.middleware_stack)
    app.middleware_stack = counting
    entry = client.get(f"/v1/ns/team-a/entries/{KEY}")
    alias = client.get(f"/v1/ns/team-a/aliases/{KEY}")  # a miss: no alias of that name
    blob = client.get(f"/v1/blobs/{body['files']['model.neff']['digest']}")
    assert alias.status_code == 404
    assert entry.status_code == 200
    assert entry.json()["key"] == KEY
    assert entry.headers["content-type"] == "application/json"
    assert int(entry.headers["content-length"]) == len(entry.content)
    assert blob.status_code == 200
    assert counting.paths == []
    assert client.get("/healthz").status_code == 200
    assert client.get(f"/v1/ns/team-a/entries/{KEY}/aliases").status_code == 200
    assert counting.paths == ["/healthz", f"/v1/ns/team-a/entries/{KEY}/aliases"]
