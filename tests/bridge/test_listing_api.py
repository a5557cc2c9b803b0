"""``GET /v1/ns/{namespace}/entries``: the listing the export pages through."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

ADMIN = "admin-secret-for-the-listing-tests-0123456789"
NEFF = b"a NEFF"
DIGEST = blake3.blake3(NEFF).hexdigest()
KEYS = sorted(f"{i:02x}" * 32 for i in (0x5A, 0x01, 0xEE, 0x33, 0x90))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    blobs, index = MemoryBlobStore(), MemoryIndex()
    settings = ServerSettings(data_dir=tmp_path, bootstrap_admin_token=ADMIN)
    with TestClient(create_app(settings, blob_store=blobs, index=index)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {ADMIN}"
        assert test_client.put(f"/v1/blobs/{DIGEST}", content=NEFF).status_code == 201
        for key in reversed(KEYS):
            put(test_client, "team-a", key)
        put(test_client, "team-ab", KEYS[0])
        yield test_client
    blobs.close()
    index.close()


def put(client: TestClient, namespace: str, key: str) -> None:
    manifest = {"key": key, "files": {"model.neff": {"digest": DIGEST, "size": len(NEFF)}}}
    response = client.put(f"/v1/ns/{namespace}/entries/{key}", content=json.dumps(manifest))
    assert response.status_code == 201, response.text


def test_pages_in_key_order_each_entry_exactly_as_get_returns_it(client: TestClient) -> None:
    first = client.get("/v1/ns/team-a/entries", params={"limit": 2}).json()
    assert [e["key"] for e in first["entries"]] == KEYS[:2]
    assert first["next"] == KEYS[1]
    rest = client.get("/v1/ns/team-a/entries", params={"after": first["next"]}).json()
    assert [e["key"] for e in rest["entries"]] == KEYS[2:]
    assert rest["next"] is None  # the page was not full: no empty page to fetch
    for entry in first["entries"] + rest["entries"]:
        assert entry == client.get(f"/v1/ns/team-a/entries/{entry['key']}").json()
        assert entry["namespace"] == "team-a"


def test_a_full_last_page_says_so(client: TestClient) -> None:
    page = client.get("/v1/ns/team-a/entries", params={"limit": 5}).json()
    assert len(page["entries"]) == 5
    assert page["next"] is None


def test_an_empty_or_other_namespace(client: TestClient) -> None:
    assert client.get("/v1/ns/nobody/entries").json() == {"entries": [], "next": None}
    page = client.get("/v1/ns/team-ab/entries").json()
    assert [e["key"] for e in page["entries"]] == [KEYS[0]]


@pytest.mark.parametrize(
    "query",
    [{"limit": 0}, {"limit": 1001}, {"limit": "ten"}, {"after": "XYZ"}, {"after": "a" * 63}],
)
def test_bad_parameters_are_400(client: TestClient, query: dict[str, object]) -> None:
    assert client.get("/v1/ns/team-a/entries", params=query).status_code == 400


def test_listing_needs_read_scope_for_the_namespace(client: TestClient) -> None:
    made = client.post(
        "/v1/admin/tokens", json={"scope": "read", "namespaces": ["team-b"], "name": "t"}
    ).json()
    other = {"Authorization": f"Bearer {made['token']}"}
    assert client.get("/v1/ns/team-a/entries", headers=other).status_code == 403
    assert client.get("/v1/ns/team-b/entries", headers=other).status_code == 200
    assert client.get("/v1/ns/team-a/entries", headers={"Authorization": ""}).status_code == 401
