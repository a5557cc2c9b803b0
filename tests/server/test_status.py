"""``GET /v1/status`` (docs/protocol.md, "Status"): who may ask and what each is told,
the namespace's view (coverage, usage, policy) and its clients' hits and misses over
a window, counted from their graph events; in protected mode and with tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from docs.doctext import ROOT, blocks
from fastapi.testclient import TestClient

from neffcache.server import __version__
from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ADMIN = "nfc_status_admin_secret"
DAY = 86400.0
KEY = "ab" * 32
NEFF = b"a neff for the status route"


class EventClock:
    """The server's events clock: the real time, or ``at`` while it is set."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self) -> float:
        return time.time() if self.at is None else self.at


def serve(tmp_path: Path, clock: EventClock | None = None, **settings: Any) -> Iterator[TestClient]:
    chosen = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0, **settings)
    blobs, index = MemoryBlobStore(), MemoryIndex()
    try:
        app = create_app(chosen, blob_store=blobs, index=index, clock=clock or EventClock())
        with TestClient(app) as client:
            yield client
    finally:
        blobs.close()
        index.close()


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[TestClient]:
    yield from serve(tmp_path)


@pytest.fixture
def events_clock() -> EventClock:
    return EventClock()


@pytest.fixture
def guarded(tmp_path: Path, events_clock: EventClock) -> Iterator[TestClient]:
    yield from serve(tmp_path, events_clock, bootstrap_admin_token=ADMIN)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def token(client: TestClient, **body: Any) -> dict[str, Any]:
    created = client.post("/v1/admin/tokens", json={"name": "t", **body}, headers=bearer(ADMIN))
    assert created.status_code == 201, created.text
    record: dict[str, Any] = created.json()
    return record


def graph(result: str, namespace: str = "team-a") -> dict[str, Any]:
    return {"kind": "graph", "namespace": namespace, "key": KEY, "result": result}


def post_at(client: TestClient, clock: EventClock, at: float, events: list[dict[str, Any]]) -> None:
    """Events received when the server's events clock (``clock``) says ``at``."""
    clock.at = at
    try:
        answer = client.post("/v1/events", json={"events": events}, headers=bearer(ADMIN))
        assert answer.status_code == 202, answer.text
    finally:
        clock.at = None


def test_an_open_server_answers_anyone_as_the_anonymous_admin(open_server: TestClient) -> None:
    before = time.time()
    answer = open_server.get("/v1/status")
    assert answer.status_code == 200, answer.text
    status = answer.json()
    assert status["server"]["version"] == __version__
    assert status["server"]["auth"] == "open"
    assert before <= status["server"]["time"] <= time.time()
    assert status["caller"] == {
        "name": "anonymous",
        "scope": "admin",
        "namespaces": ["*"],
        "trusted": True,
    }
    assert status["namespace"] is None


def test_with_tokens_each_caller_is_told_its_own_token(guarded: TestClient) -> None:
    reader = token(guarded, scope="read", namespaces=["team-a"])
    writer = token(guarded, scope="write", namespaces=["team-b", "team-c"], trusted=True)
    for record, scope, namespaces, trusted in (
        (reader, "read", ["team-a"], False),
        (writer, "write", ["team-b", "team-c"], True),
    ):
        answer = guarded.get("/v1/status", headers=bearer(record["token"]))
        assert answer.status_code == 200, answer.text
        status = answer.json()
        assert status["server"]["auth"] == "tokens"
        assert status["caller"] == {
            "name": record["token_id"],
            "scope": scope,
            "namespaces": namespaces,
            "trusted": trusted,
        }
    admin = guarded.get("/v1/status", headers=bearer(ADMIN)).json()["caller"]
    assert admin["scope"] == "admin"
    assert admin["namespaces"] == ["*"]


def test_no_token_or_a_bad_one_is_401(guarded: TestClient) -> None:
    assert guarded.get("/v1/status").status_code == 401
    assert guarded.get("/v1/status", headers=bearer("nfc_x_y")).status_code == 401
    revoked = token(guarded, scope="read", namespaces=["team-a"])
    gone = guarded.delete(f"/v1/admin/tokens/{revoked['token_id']}", headers=bearer(ADMIN))
    assert gone.status_code == 204
    assert guarded.get("/v1/status", headers=bearer(revoked["token"])).status_code == 401


def test_a_namespace_the_token_does_not_read_is_403(guarded: TestClient) -> None:
    reader = bearer(token(guarded, scope="read", namespaces=["team-a"])["token"])
    assert guarded.get("/v1/status?namespace=team-a", headers=reader).status_code == 200
    refused = guarded.get("/v1/status?namespace=team-b", headers=reader)
    assert refused.status_code == 403
    assert "team-b" in refused.json()["detail"]
    assert guarded.get("/v1/status?namespace=team-b", headers=bearer(ADMIN)).status_code == 200


@pytest.mark.parametrize(
    "query",
    [
        "namespace=Team-A",
        "namespace=",
        "namespace=a/b",
        "window=0",
        "window=-5",
        f"window={90 * DAY + 1}",
        "window=nan",
        "window=soon",
    ],
)
def test_a_bad_namespace_or_window_is_400(open_server: TestClient, query: str) -> None:
    answer = open_server.get(f"/v1/status?{query}")
    assert answer.status_code == 400, answer.text
    assert isinstance(answer.json()["detail"], str)


def test_the_namespace_view_has_its_usage_quota_and_policy(guarded: TestClient) -> None:
    admin = bearer(ADMIN)
    absent = guarded.get("/v1/status?namespace=team-a", headers=admin).json()["namespace"]
    assert absent["exists"] is False
    assert (absent["entries"], absent["bytes"], absent["quota_bytes"]) == (0, 0, None)

    created = guarded.post(
        "/v1/admin/namespaces/team-a", json={"quota_bytes": 1 << 30}, headers=admin
    )
    assert created.status_code == 201, created.text
    digest = blake3.blake3(NEFF).hexdigest()
    assert guarded.put(f"/v1/blobs/{digest}", content=NEFF, headers=admin).status_code == 201
    manifest = {"key": KEY, "files": {"model.neff": {"digest": digest, "size": len(NEFF)}}}
    published = guarded.put(f"/v1/ns/team-a/entries/{KEY}", json=manifest, headers=admin)
    assert published.status_code == 201, published.text
    guarded.app.state.backends.usage._held.clear()  # type: ignore[attr-defined]

    reader = bearer(token(guarded, scope="read", namespaces=["team-a"])["token"])
    view = guarded.get("/v1/status?namespace=team-a", headers=reader).json()["namespace"]
    assert view["name"] == "team-a"
    assert view["exists"] is True
    assert (view["entries"], view["bytes"], view["quota_bytes"]) == (1, len(NEFF), 1 << 30)
    shown = guarded.get("/v1/admin/namespaces/team-a", headers=admin).json()
    assert view["policy"] == {k: v for k, v in shown.items() if k not in ("usage", "pins")}
    assert view["window_seconds"] == 7 * DAY


def test_hits_and_misses_come_from_the_windows_graph_events(
    guarded: TestClient, events_clock: EventClock
) -> None:
    now = time.time()

    def post(at: float, events: list[dict[str, Any]]) -> None:
        post_at(guarded, events_clock, at, events)

    post(now - 10 * DAY, [graph("hit"), graph("miss"), graph("miss")])
    post(now - 2 * DAY, [graph("hit"), graph("hit"), graph("miss")])
    post(now - 60, [graph("hit"), graph("hit", "team-b"), graph("miss", "team-b")])
    counters = {"kind": "counters", "namespace": "team-a", "counts": {"hits_l1": 9}}
    post(now - 60, [counters])

    def lookups(query: str) -> dict[str, Any]:
        answer = guarded.get(f"/v1/status?namespace=team-a{query}", headers=bearer(ADMIN))
        assert answer.status_code == 200, answer.text
        view: dict[str, Any] = answer.json()["namespace"]
        return {"window": view["window_seconds"], **view["lookups"]}

    assert lookups("") == {"window": 7 * DAY, "hits": 3, "misses": 1}
    assert lookups(f"&window={int(30 * DAY)}") == {"window": 30 * DAY, "hits": 4, "misses": 3}
    assert lookups("&window=3600") == {"window": 3600, "hits": 1, "misses": 0}
    other = guarded.get("/v1/status?namespace=team-b", headers=bearer(ADMIN)).json()
    assert other["namespace"]["lookups"] == {"hits": 1, "misses": 1}


def test_the_documented_answer_has_the_fields_served(guarded: TestClient) -> None:
    protocol = ROOT / "docs" / "protocol.md"
    (example,) = [b.text for b in blocks(protocol) if b.text.startswith('{"server"')]
    shown = json.loads(example)
    served = guarded.get("/v1/status?namespace=team-a", headers=bearer(ADMIN)).json()

    def shape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        return type(value).__name__ if value is not None else "null"

    assert set(shown) == set(served)
    for part in ("server", "caller", "namespace"):
        assert set(shown[part]) == set(served[part]), part
    assert set(shown["namespace"]["policy"]) == set(served["namespace"]["policy"])
    assert shape(shown["namespace"]["lookups"]) == shape(served["namespace"]["lookups"])
