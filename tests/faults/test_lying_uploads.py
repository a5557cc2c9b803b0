"""Lying uploads against a real ``neffcache serve``
(filesystem blobs, SQLite index), sent byte for byte over raw sockets.

Nothing lost, for every lie: the answer is the documented one (``400``, or no answer
when the client hung up), nothing is stored (the blob is absent and no upload file is
left in the store's staging directory), no namespace quota is consumed (a namespace
whose quota is exactly one full-size entry still accepts one) and an entry naming the
rejected digest is refused with ``400`` and ``missing``.

Already proven elsewhere, not repeated: a wrong digest and a Content-Length longer than
the body through TestClient on every backend (tests/server/test_api.py,
``test_lying_uploads_store_nothing``), ``413`` over ``max_blob_bytes``, ``507`` with
nothing kept, and the stalled-body ``408`` at unit level (same file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from faults.support import Server, digest, raw_request, running_server

from neffcache.server.app import create_app
from neffcache.server.blobs import open_blob_store
from neffcache.server.index import open_index
from neffcache.server.settings import ServerSettings

SIZE = 256 * 1024  # several socket reads: a body can be cut off in the middle

# A lie: given the port, the honest bytes and a digest, send it; the first answer's
# status, or None when the server (rightly) closed without one.
Lie = Callable[[int, bytes], int | None]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("lying") / "data") as running:
        yield running


def put_head(key: str, *headers: str) -> str:
    return "\n".join([f"PUT /v1/blobs/{key} HTTP/1.1", "Host: 127.0.0.1", *headers])


def wrong_digest(port: int, data: bytes) -> int | None:
    other = digest(b"not these bytes" + data)
    return raw_request(port, put_head(other, f"Content-Length: {len(data)}"), data)


def shorter_length(port: int, data: bytes) -> int | None:
    # The server reads what was announced; the rest is the next request's garbage.
    head = put_head(digest(data), f"Content-Length: {len(data) - 1000}")
    return raw_request(port, head, data)


def longer_length(port: int, data: bytes) -> int | None:
    # All the bytes, then the client says it has nothing more (half-close).
    head = put_head(digest(data), f"Content-Length: {len(data) + 1000}")
    return raw_request(port, head, data, end="shut")


def missing_length(port: int, data: bytes) -> int | None:
    chunked = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    return raw_request(port, put_head(digest(data), "Transfer-Encoding: chunked"), chunked)


def short_body(port: int, data: bytes) -> int | None:
    # Half the announced bytes, then the client dies.
    head = put_head(digest(data), f"Content-Length: {len(data)}")
    return raw_request(port, head, data[: len(data) // 2], end="close")


LIES: dict[str, tuple[Lie, set[int | None]]] = {
    "wrong digest": (wrong_digest, {400}),
    "Content-Length shorter than the body": (shorter_length, {400}),
    # No answer is owed to a client that stopped sending; 400 is fine too.
    "Content-Length longer than the body": (longer_length, {400, None}),
    "no Content-Length (chunked)": (missing_length, {400}),
    "short body, client hangs up": (short_body, {None}),
}


def assert_nothing_stored(server: Server, rejected: str, namespace: str) -> None:
    """Absent, nothing staged, refused by an entry, and the quota untouched."""
    assert server.wait_until_unstaged() == []
    assert not server.blob_path(rejected).exists()
    assert server.http.head(f"/v1/blobs/{rejected}").status_code == 404
    missing = server.http.post("/v1/blobs/missing", json={"digests": [rejected]})
    assert missing.json() == {"missing": [rejected]}
    key = os.urandom(32).hex()
    manifest = {"key": key, "files": {"model.neff": {"digest": rejected, "size": SIZE}}}
    refused = server.http.put(f"/v1/ns/{namespace}/entries/{key}", json=manifest)
    assert refused.status_code == 400
    assert refused.json()["missing"] == [rejected]
    # The quota is exactly one full-size entry: it still takes one.
    honest = os.urandom(SIZE)
    assert server.http.put(f"/v1/blobs/{digest(honest)}", content=honest).status_code == 201
    key = os.urandom(32).hex()
    manifest = {"key": key, "files": {"model.neff": {"digest": digest(honest), "size": SIZE}}}
    assert server.http.put(f"/v1/ns/{namespace}/entries/{key}", json=manifest).status_code == 201


@pytest.mark.e2e
@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_upload_is_rejected_and_stores_nothing(server: Server, lie: str) -> None:
    """Nothing lost: the documented answer, no blob under the announced digest (nor
    under the bytes' own), no staging file, an entry naming it is ``400 missing``, and
    a namespace with a quota of one full-size entry still accepts one."""
    send, answers = LIES[lie]
    namespace = "lie-" + "".join(c if c.isalnum() else "-" for c in lie.lower())[:50]
    created = server.http.post(f"/v1/admin/namespaces/{namespace}", json={"quota_bytes": SIZE})
    assert created.status_code == 201
    data = os.urandom(SIZE)
    assert send(server.port, data) in answers
    assert_nothing_stored(server, digest(data), namespace)
    if lie == "wrong digest":
        assert_nothing_stored(server, digest(b"not these bytes" + data), namespace)


@pytest.mark.e2e
def test_a_client_that_hangs_up_is_an_aborted_request_not_a_server_fault(
    server: Server,
) -> None:
    """An operator's log tells faults from aborts: a hang-up mid-upload is no ASGI
    exception with a traceback (the answer, 499 as nginx logs it, reaches no one)."""
    for _ in range(3):
        assert short_body(server.port, os.urandom(SIZE)) is None
    assert server.wait_until_unstaged() == []
    assert server.http.get("/healthz").status_code == 200  # the log is written by now
    log = server.log.read_text()
    assert "Exception in ASGI application" not in log
    assert "ClientDisconnect" not in log


@pytest.mark.e2e
def test_bytes_after_an_honest_body_never_join_the_blob(server: Server) -> None:
    """Nothing lost: the server reads exactly Content-Length bytes, and the extra ones
    are a malformed next request that uvicorn answers ``400`` (closing the connection,
    which usually aborts the upload too; ``201`` if the upload was done first). Either
    way the announced blob is absent or exactly the announced bytes, no blob holds the
    extra bytes (alone or appended) and nothing is left staged."""
    data, extra = os.urandom(SIZE), os.urandom(4096)
    head = put_head(digest(data), f"Content-Length: {len(data)}")
    assert raw_request(server.port, head, data + extra) in (201, 400)
    assert server.wait_until_unstaged() == []
    got = server.http.get(f"/v1/blobs/{digest(data)}")
    assert got.status_code == 404 or got.content == data
    for absent in (digest(extra), digest(data + extra)):
        assert server.http.head(f"/v1/blobs/{absent}").status_code == 404


def test_extra_bytes_handed_to_the_app_are_400_and_store_nothing(tmp_path: Path) -> None:
    """Nothing lost: when the HTTP layer passes on more body than Content-Length
    announced (TestClient does; uvicorn cuts it, see the test above), the upload is
    ``400``, no blob exists under either digest and nothing is left staged."""
    blobs = open_blob_store((tmp_path / "store").as_uri())
    index = open_index(f"sqlite://{tmp_path / 'index.db'}")
    app = create_app(ServerSettings(data_dir=tmp_path), blob_store=blobs, index=index)
    data, extra = os.urandom(SIZE), os.urandom(4096)
    try:
        with TestClient(app) as client:
            for announced in (data, data + extra):
                response = client.put(
                    f"/v1/blobs/{digest(announced)}",
                    content=data + extra,
                    headers={"Content-Length": str(len(data))},
                )
                assert response.status_code == 400
                assert "longer than Content-Length" in response.json()["detail"]
                assert list(blobs.staging_dir().iterdir()) == []
                assert blobs.size(digest(announced)) is None
            key = os.urandom(32).hex()
            manifest = {"key": key, "files": {"m.neff": {"digest": digest(data), "size": SIZE}}}
            refused = client.put(f"/v1/ns/team-a/entries/{key}", json=manifest)
            assert refused.status_code == 400
            assert refused.json()["missing"] == [digest(data)]
    finally:
        blobs.close()
        index.close()
