"""``accel_redirect_prefix`` (api/blobs.py): a GET marked by the nginx in front is
answered with headers only and ``X-Accel-Redirect`` naming the blob's file, once the
file is verified; requests without the mark, and stores without files, get bytes.
tests/deploy/test_nginx_front.py runs the same behind a real nginx."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from fastapi.testclient import TestClient

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

PREFIX = "/_neffcache"
MARK = {"X-Neffcache-Accel": "on"}


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = ServerSettings(
        data_dir=tmp_path / "data",
        blob_url=(tmp_path / "store").as_uri(),
        accel_redirect_prefix=PREFIX,
    )
    with TestClient(create_app(settings, index=MemoryIndex())) as http:
        yield http


def test_a_marked_get_is_headers_and_the_blob_files_place(client: TestClient) -> None:
    data = os.urandom(20_000)
    key = digest(data)
    assert client.put(f"/v1/blobs/{key}", content=data).status_code == 201
    for headers in (MARK, {**MARK, "Range": "bytes=10-19"}):
        answer = client.get(f"/v1/blobs/{key}", headers=headers)
        assert answer.status_code == 200  # nginx cuts the range from the file
        assert answer.content == b""
        assert answer.headers["x-accel-redirect"] == f"{PREFIX}/blobs/{key[:2]}/{key}"
        assert answer.headers["etag"] == f'"{key}"'
        assert answer.headers["content-type"] == "application/octet-stream"
    plain = client.get(f"/v1/blobs/{key}")
    assert plain.content == data
    assert "x-accel-redirect" not in plain.headers


def test_a_corrupted_file_is_quarantined_instead_of_handed_over(
    client: TestClient, tmp_path: Path
) -> None:
    data = os.urandom(20_000)
    key = digest(data)
    client.put(f"/v1/blobs/{key}", content=data)
    path = tmp_path / "store" / "blobs" / key[:2] / key
    path.write_bytes(b"rot" + data[3:])
    assert client.get(f"/v1/blobs/{key}", headers=MARK).status_code == 404
    assert not path.exists()
    assert client.get(f"/v1/blobs/{key}", headers=MARK).status_code == 404  # absent now
    metrics = client.get("/metrics").text
    assert 'neffcache_blob_mismatches_total{found_by="read"} 1.0' in metrics


def test_a_store_without_files_serves_bytes(tmp_path: Path) -> None:
    blobs = MemoryBlobStore()
    settings = ServerSettings(data_dir=tmp_path, accel_redirect_prefix=PREFIX)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as http:
        data = b"bytes from memory"
        http.put(f"/v1/blobs/{digest(data)}", content=data)
        answer = http.get(f"/v1/blobs/{digest(data)}", headers=MARK)
        assert answer.content == data
        assert "x-accel-redirect" not in answer.headers
    blobs.close()


@pytest.mark.parametrize("prefix", ["relative", "/trailing/", "/a b", "/new\nline"])
def test_a_prefix_that_is_no_absolute_path_is_refused(prefix: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="accel_redirect_prefix"):
        ServerSettings(data_dir=tmp_path, accel_redirect_prefix=prefix)
