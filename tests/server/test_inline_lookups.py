"""A lookup that asks for a file inline (``X-Neffcache-Inline``, protocol/inline.py)
gets the entry's JSON and that file's verified bytes in one answer, by key or by alias,
through the fast path or FastAPI's routes alike; anything the server cannot or should
not inline is the plain JSON answer, and a blob found corrupt is quarantined, never
sent (docs/protocol.md#a-file-inline)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.api import ADDRESS, KEY, digest, manifest, put_blob

from neffcache.protocol import inline
from neffcache.server.app import create_app
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

NEFF = b"N" * 5000 + b"the neff"
LOG = b"a compile log"
DIRECT = "d" * 64
ASK = {inline.HEADER: inline.asked("model.neff", 1 << 20)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FsBlobStore]:
    blobs = FsBlobStore(tmp_path / "blobs")
    try:
        yield blobs
    finally:
        blobs.close()


@pytest.fixture
def client(tmp_path: Path, store: FsBlobStore) -> Iterator[TestClient]:
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    app = create_app(settings, blob_store=store, index=MemoryIndex())
    with TestClient(app) as test_client:
        for data in (NEFF, LOG):
            assert put_blob(test_client, data) in (200, 201)
        files = {"model.neff": NEFF, "log-neuron-cc.txt": LOG}
        body = manifest(files, direct_key=DIRECT, neuron_address=ADDRESS)
        assert test_client.put(f"/v1/ns/team-a/entries/{KEY}", json=body).status_code == 201
        yield test_client


def split(answer: Any) -> tuple[bytes, bytes]:
    assert answer.headers["content-type"] == inline.MEDIA_TYPE
    assert int(answer.headers["content-length"]) == len(answer.content)
    parts = inline.split(answer.content)
    assert parts is not None
    return parts[0], bytes(parts[1])


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/ns/team-a/entries/{KEY}",
        f"/v1/ns/team-a/aliases/{DIRECT}",
        f"/v1/ns/team-a/aliases/{ADDRESS.replace('+', '%2B')}",
    ],
)
def test_an_asked_file_comes_inline_after_the_lookups_json(client: TestClient, path: str) -> None:
    plain = client.get(path)
    answer = client.get(path, headers=ASK)
    assert plain.status_code == answer.status_code == 200
    assert plain.headers["content-type"] == "application/json"
    json_part, data = split(answer)
    assert data == NEFF
    # The JSON part is the lookup's own answer, stamps and all.
    assert json_part == plain.content


def test_another_file_of_the_entry_can_be_asked_for(client: TestClient) -> None:
    ask = {inline.HEADER: inline.asked("log-neuron-cc.txt", 100)}
    _, data = split(client.get(f"/v1/ns/team-a/entries/{KEY}", headers=ask))
    assert data == LOG


@pytest.mark.parametrize(
    "asked",
    [
        inline.asked("model.neff", len(NEFF) - 1),  # larger than asked
        inline.asked("model.hlo_module.pb", 1 << 20),  # no such file in the entry
        "model.neff",  # not an ask
        "model.neff=lots",
        "../../etc/passwd=10",
    ],
)
def test_what_cannot_be_inlined_is_the_plain_answer(client: TestClient, asked: str) -> None:
    plain = client.get(f"/v1/ns/team-a/entries/{KEY}")
    answer = client.get(f"/v1/ns/team-a/entries/{KEY}", headers={inline.HEADER: asked})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == plain.content


def test_a_miss_is_a_miss_whatever_is_asked(client: TestClient) -> None:
    for path in (f"/v1/ns/team-a/entries/{'b' * 64}", f"/v1/ns/team-a/aliases/{'c' * 64}"):
        answer = client.get(path, headers=ASK)
        assert answer.status_code == 404
        assert answer.json()["reason"] == "absent"


def test_a_corrupt_blob_is_quarantined_and_never_inlined(
    client: TestClient, store: FsBlobStore
) -> None:
    path = store.local_path(digest(NEFF))
    assert path is not None
    path.write_bytes(NEFF[:-1] + b"X")  # same size, other bytes
    answer = client.get(f"/v1/ns/team-a/entries/{KEY}", headers=ASK)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"  # the entry, without it
    assert b"the neff" not in answer.content
    assert client.get(f"/v1/blobs/{digest(NEFF)}").status_code == 404  # quarantined
    assert store.size(digest(NEFF)) is None


def test_an_inlined_blob_is_counted_as_a_blob_read(client: TestClient) -> None:
    client.get(f"/v1/ns/team-a/aliases/{DIRECT}", headers=ASK)
    metrics = client.get("/metrics").text
    assert "neffcache_blob_inlined_total 1.0" in metrics
    assert 'neffcache_blob_reads_total{result="hit"} 1.0' in metrics
    assert f"neffcache_blob_bytes_served_total {float(len(NEFF))}" in metrics


def test_inline_answers_are_the_same_through_fastapi(client: TestClient) -> None:
    paths = [
        f"/v1/ns/team-a/entries/{KEY}",
        f"/v1/ns/team-a/aliases/{DIRECT}",
        f"/v1/ns/team-a/aliases/{ADDRESS.replace('+', '%2B')}",
        f"/v1/ns/team-a/aliases/{'c' * 64}",
        "/v1/ns/team-a/aliases/not-an-alias",
        "/v1/ns/team-a/aliases/x%01y",  # a control character: the app's own 400
        "/v1/ns/team-a/aliases/x%0Ay",
        "/v1/ns/Team-A/aliases/" + DIRECT,  # not a namespace: FastAPI's validation
    ]

    def answers() -> list[Any]:
        out = []
        for path in paths:
            for headers in ({}, ASK):
                got = client.get(path, headers=headers)
                kept = {k: v for k, v in got.headers.items() if k not in ("date", "server")}
                out.append((got.status_code, got.content, kept))
        return out

    app: Any = client.app
    fast = app.fast_path
    on = answers()
    app.fast_path = None
    try:
        off = answers()
    finally:
        app.fast_path = fast
    assert [status for status, _, _ in on][::2] == [200, 200, 200, 404, 400, 400, 400, 400]
    assert on == off
