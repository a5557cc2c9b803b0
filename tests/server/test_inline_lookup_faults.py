"""A lookup that asks for a file inline (protocol/inline.py) where the extra part can
go wrong: the blob store failing under the inline read, an HTTP cache between the
server and its clients, and asks the fast path and FastAPI's routes must read alike
(docs/protocol.md#a-file-inline)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.api import ADDRESS, KEY, manifest, put_blob

from neffcache.protocol import inline
from neffcache.server.app import create_app
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.errors import StoreError
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

NEFF = b"N" * 5000 + b"the neff"
DIRECT = "d" * 64
ASK = {inline.HEADER: inline.asked("model.neff", 1 << 20)}
ENTRY_PATH = f"/v1/ns/team-a/entries/{KEY}"


class FailingReads(FsBlobStore):
    """A filesystem store whose reads fail once ``broken`` (a disk that returns EIO, a
    blob file restored unreadable): what fs.py raises then."""

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
        assert put_blob(test_client, NEFF) in (200, 201)
        body = manifest({"model.neff": NEFF}, direct_key=DIRECT, neuron_address=ADDRESS)
        assert test_client.put(ENTRY_PATH, json=body).status_code == 201
        yield test_client


def both_paths(client: TestClient, ask: Any) -> list[tuple[int, bytes, dict[str, str]]]:
    """What ``ask()`` gets through the fast path, then through FastAPI's routes."""
    app: Any = client.app
    fast = app.fast_path
    answers = [ask()]
    app.fast_path = None
    try:
        answers.append(ask())
    finally:
        app.fast_path = fast
    return [
        (got.status_code, got.content, {k: v for k, v in got.headers.items() if k != "date"})
        for got in answers
    ]


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


# --- passing: the fast path reads an ask as FastAPI does -------------------------------


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
    fast, slow = both_paths(client, lambda: client.get(path, headers=sent))
    assert fast == slow
