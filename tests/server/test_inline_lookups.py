"""A lookup that asks for a file inline (``X-Neffcache-Inline``, protocol/inline.py)
gets the entry's JSON and that file's verified bytes in one answer, by key or by alias,
through the fast path or FastAPI's routes alike; anything the server cannot or should
not inline is the plain JSON answer, a blob found corrupt is quarantined, never sent,
and a store that fails under the inline read leaves the lookup answered; every answer
tells an HTTP cache that it depends on the ask (docs/protocol.md#a-file-inline)."""

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
from neffcache.server.errors import StoreError
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

NEFF = b"N" * 5000 + b"the neff"
LOG = b"a compile log"
DIRECT = "d" * 64
ASK = {inline.HEADER: inline.asked("model.neff", 1 << 20)}
ENTRY_PATH = f"/v1/ns/team-a/entries/{KEY}"


class FailingReads(FsBlobStore):
    """The filesystem store, whose reads fail once ``broken`` (a disk that returns EIO,
    a blob file restored unreadable): what fs.py raises then."""

    broken = False

    def read(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes] | None:
        if self.broken:
            raise StoreError(f"read {digest}: [Errno 5] Input/output error")
        return super().read(digest, start, end)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FailingReads]:
    blobs = FailingReads(tmp_path / "blobs")
    try:
        yield blobs
    finally:
        blobs.close()


@pytest.fixture
def client(tmp_path: Path, store: FailingReads) -> Iterator[TestClient]:
    settings = ServerSettings(data_dir=tmp_path, eviction_interval_seconds=0)
    app = create_app(settings, blob_store=store, index=MemoryIndex())
    with TestClient(app) as test_client:
        for data in (NEFF, LOG):
            assert put_blob(test_client, data) in (200, 201)
        files = {"model.neff": NEFF, "log-neuron-cc.txt": LOG}
        body = manifest(files, direct_key=DIRECT, neuron_address=ADDRESS)
        assert test_client.put(ENTRY_PATH, json=body).status_code == 201
        yield test_client


def both_paths(client: TestClient, path: str, headers: Any) -> list[Any]:
    """What a GET of ``path`` gets through the fast path, then through FastAPI's routes:
    status, body and headers (but the date and server)."""
    app: Any = client.app
    fast = app.fast_path
    answers = [client.get(path, headers=headers)]
    app.fast_path = None
    try:
        answers.append(client.get(path, headers=headers))
    finally:
        app.fast_path = fast
    skipped = ("date", "server")
    return [
        (got.status_code, got.content, {k: v for k, v in got.headers.items() if k not in skipped})
        for got in answers
    ]


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

    statuses = []
    for path in paths:
        for headers in ({}, ASK):
            fast, slow = both_paths(client, path, headers)
            assert fast == slow, (path, headers)
            statuses.append(fast[0])
    assert statuses[::2] == [200, 200, 200, 404, 400, 400, 400, 400]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "fastapi"])
def test_a_store_failing_under_the_inline_read_still_answers_the_lookup(
    client: TestClient, store: FailingReads, fast: bool
) -> None:
    """The inline file is an optimisation of the lookup: the index answered, and the
    JSON alone is what a server that does not inline sends. A 503 instead makes every
    client skip the server for its back-off, a hook whose L1 already holds the NEFF
    included."""
    app: Any = client.app
    kept = app.fast_path
    if not fast:
        app.fast_path = None
    try:
        plain = client.get(ENTRY_PATH)
        store.broken = True
        answer = client.get(ENTRY_PATH, headers=ASK)
    finally:
        app.fast_path = kept
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == plain.content


def test_an_answer_that_depends_on_the_inline_ask_says_so_to_caches(client: TestClient) -> None:
    """A shared HTTP cache in front of the server (RFC 9111) must not hand the framed
    answer to a request that did not ask for it, which reads it as JSON: ``Vary``
    names the header the answer was chosen by (RFC 9110 12.5.5)."""
    for headers in (ASK, {}):
        answer = client.get(ENTRY_PATH, headers=headers)
        assert answer.status_code == 200
        vary = [v.strip().lower() for v in answer.headers.get("vary", "").split(",")]
        assert inline.HEADER.lower() in vary, (headers, dict(answer.headers))


# --- the fast path reads an ask as FastAPI does ----------------------------------------


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        (ENTRY_PATH, [(inline.HEADER, "model.neff=1"), (inline.HEADER, "model.neff=100000")]),
        (ENTRY_PATH, [(inline.HEADER, "model.neff=100000"), (inline.HEADER, "model.neff=1")]),
        (ENTRY_PATH, [(inline.HEADER, "  model.neff=100000  ")]),
        (ENTRY_PATH, [(inline.HEADER, "")]),
        (ENTRY_PATH, [(inline.HEADER, "model.neff=0000000000100000")]),  # past 12 digits
        (ENTRY_PATH, [(inline.HEADER.upper(), "model.neff=100000")]),
        (f"/v1/ns/team-a/aliases/{ADDRESS.replace('/', '%2F')}", list(ASK.items())),
        (f"/v1/ns/team-a/aliases/{ADDRESS}/", list(ASK.items())),
        (f"/v1/ns/team-a/aliases/{DIRECT}/", list(ASK.items())),
        ("/v1/ns/team-a/aliases/%C2%85", list(ASK.items())),  # a C1 control character
        ("/v1/ns/team-a/aliases/" + "x" * 5000, list(ASK.items())),
    ],
)
def test_an_ask_is_answered_alike_by_the_fast_path_and_fastapi(
    client: TestClient, path: str, sent: list[tuple[str, str]]
) -> None:
    """Alias lookups joined the fast path with a broad pattern (any path without a
    control character): the answers, inline or not, must stay FastAPI's own."""
    fast, slow = both_paths(client, path, sent)
    assert fast == slow
