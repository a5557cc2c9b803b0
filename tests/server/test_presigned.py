"""Blob GETs answered with a redirect to a presigned S3 URL (``blob_redirect_seconds``),
against moto's S3 server (tests/support/services.py) through Starlette's TestClient.

The "nothing lost, nothing wrong" criteria, test by test in the docstrings, come down
to: a redirect is given only for a blob that exists, only to a caller the server would
have served, and its URL fetches exactly the blob's bytes with no credentials; in every
other case the server answers as it did without redirects.

Not tested: expiry at S3. moto (5.2) serves a presigned URL (SigV2 or SigV4) after it
has expired, so a test could only fake it; the tests check the lifetime the URL
carries instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import blake3
import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore, open_blob_store
from neffcache.server.blobs.s3 import S3BlobStore
from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings, load_settings

MIN = 4096  # blob_redirect_min_bytes in these tests
SECONDS = 120  # blob_redirect_seconds


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def settings(tmp_path: Path, **extra: object) -> ServerSettings:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "eviction_interval_seconds": 0,
        "blob_redirect_seconds": SECONDS,
        "blob_redirect_min_bytes": MIN,
    }
    values.update(extra)
    return ServerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def s3_store(s3_bucket: str) -> Iterator[BlobStore]:
    store = open_blob_store(s3_bucket)
    yield store
    store.close()


def serve(store: BlobStore, config: ServerSettings) -> TestClient:
    return TestClient(
        create_app(config, blob_store=store, index=MemoryIndex()), follow_redirects=False
    )


def lifetime(url: str) -> float:
    """The seconds a presigned URL has left: SigV4's ``X-Amz-Expires`` (from its
    ``X-Amz-Date``, a moment ago), or SigV2's ``Expires`` (an absolute time), which
    botocore still signs with for us-east-1 and custom endpoints."""
    query = parse_qs(urlsplit(url).query)
    if "X-Amz-Expires" in query:
        assert "X-Amz-Signature" in query
        return float(query["X-Amz-Expires"][0])
    assert "Signature" in query
    return float(query["Expires"][0]) - time.time()


def fetch_anonymously(url: str) -> httpx.Response:
    """GET ``url`` as a stranger would: no token, no AWS credentials, no proxy."""
    return httpx.get(url, timeout=30, trust_env=False)


def test_a_big_blob_is_redirected_to_a_url_that_serves_its_bytes(
    s3_store: BlobStore, s3_endpoint: str, tmp_path: Path
) -> None:
    """Nothing wrong: the 307 names the blob's presigned URL, which yields exactly the
    uploaded bytes to a request carrying no credentials, and lives the configured time;
    HEAD is still answered by the server itself."""
    data = os.urandom(MIN * 3)
    with serve(s3_store, settings(tmp_path)) as client:
        assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        answer = client.get(f"/v1/blobs/{digest(data)}")
        assert answer.status_code == 307
        assert answer.headers["cache-control"] == "no-store"
        assert answer.content == b""
        location = answer.headers["location"]
        assert location.startswith(s3_endpoint + "/")
        assert digest(data) in urlsplit(location).path
        assert abs(lifetime(location) - SECONDS) < 60  # slack for a slow machine
        fetched = fetch_anonymously(location)
        assert fetched.status_code == 200
        assert fetched.content == data
        head = client.head(f"/v1/blobs/{digest(data)}")
        assert head.status_code == 200
        assert head.headers["content-length"] == str(len(data))


def test_exactly_the_threshold_is_redirected(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing lost: a blob of exactly ``blob_redirect_min_bytes`` is redirected (the
    setting says "at least"), one byte less is served with its bytes."""
    at, under = os.urandom(MIN), os.urandom(MIN - 1)
    with serve(s3_store, settings(tmp_path)) as client:
        for data in (at, under):
            assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        assert client.get(f"/v1/blobs/{digest(at)}").status_code == 307
        small = client.get(f"/v1/blobs/{digest(under)}")
        assert small.status_code == 200
        assert small.content == under


def test_no_redirect_when_off(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing changed by default: with ``blob_redirect_seconds`` 0 (the default) a big
    blob is served by the server, whole and right."""
    assert ServerSettings(data_dir=tmp_path).blob_redirect_seconds == 0
    data = os.urandom(MIN * 3)
    with serve(s3_store, ServerSettings(data_dir=tmp_path, blob_redirect_min_bytes=0)) as client:
        assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        answer = client.get(f"/v1/blobs/{digest(data)}")
        assert answer.status_code == 200
        assert answer.content == data


def test_no_redirect_from_a_filesystem_store(tmp_path: Path) -> None:
    """Nothing lost: a store that cannot presign serves the blob itself, redirects on."""
    store = open_blob_store((tmp_path / "blobs").as_uri())
    data = os.urandom(MIN * 3)
    try:
        with serve(store, settings(tmp_path, blob_redirect_min_bytes=0)) as client:
            assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
            answer = client.get(f"/v1/blobs/{digest(data)}")
            assert answer.status_code == 200
            assert answer.content == data
    finally:
        store.close()


def test_a_miss_is_a_404_never_a_redirect(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing wrong: an absent blob is a 404 from the server, never a redirect to a
    URL that would 404 at S3, and it counts as a miss."""
    with serve(s3_store, settings(tmp_path, blob_redirect_min_bytes=0)) as client:
        answer = client.get(f"/v1/blobs/{'ab' * 32}")
        assert answer.status_code == 404
        assert "location" not in answer.headers
        found = samples(client)
    assert found[("neffcache_blob_reads_total", (("result", "miss"),))] == 1
    assert found.get(("neffcache_blob_redirects_total", ()), 0) == 0


def test_tokens_are_checked_before_any_redirect(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing leaked: without a valid token (none, unknown, revoked) a big blob is a
    401 without a Location; a read token gets the redirect."""
    data = os.urandom(MIN * 3)
    url = f"/v1/blobs/{digest(data)}"
    with serve(s3_store, settings(tmp_path)) as client:
        admin = client.post("/v1/admin/tokens", json={"scope": "admin", "namespaces": ["*"]})
        assert admin.status_code == 201
        as_admin = {"Authorization": f"Bearer {admin.json()['token']}"}
        reader = client.post(
            "/v1/admin/tokens", json={"scope": "read", "namespaces": ["team-a"]}, headers=as_admin
        ).json()
        as_reader = {"Authorization": f"Bearer {reader['token']}"}
        assert client.put(url, content=data, headers=as_admin).status_code == 201
        for headers in ({}, {"Authorization": "Bearer nfc_bogus_x"}):
            refused = client.get(url, headers=headers)
            assert refused.status_code == 401
            assert "location" not in refused.headers
        assert client.get(url, headers=as_reader).status_code == 307
        revoked = client.delete(f"/v1/admin/tokens/{reader['token_id']}", headers=as_admin)
        assert revoked.status_code == 204
        refused = client.get(url, headers=as_reader)
        assert refused.status_code == 401
        assert "location" not in refused.headers


def test_ranges_are_served_not_redirected(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing wrong: a range (which only the server can verify, by hashing the whole
    blob) is served by the server as before; a bad range is still the server's 416."""
    data = os.urandom(MIN * 3)
    with serve(s3_store, settings(tmp_path)) as client:
        assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        part = client.get(f"/v1/blobs/{digest(data)}", headers={"Range": "bytes=10-99"})
        assert part.status_code == 206
        assert part.content == data[10:100]
        outside = client.get(f"/v1/blobs/{digest(data)}", headers={"Range": f"bytes={MIN * 9}-"})
        assert outside.status_code == 416


def test_a_store_that_cannot_sign_serves_the_blob(
    s3_store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing lost: when presigning fails the blob is served by the server, whole."""

    def cannot_sign(self: S3BlobStore, digest: str, seconds: int) -> str:
        raise StoreError("S3 presign failed: NoCredentialsError")

    monkeypatch.setattr(S3BlobStore, "presign", cannot_sign)
    data = os.urandom(MIN * 3)
    with serve(s3_store, settings(tmp_path)) as client:
        assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        answer = client.get(f"/v1/blobs/{digest(data)}")
        assert answer.status_code == 200
        assert answer.content == data


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_redirects_are_counted_apart_from_bytes_served(s3_store: BlobStore, tmp_path: Path) -> None:
    """Nothing miscounted: a redirect is a hit and a redirect, its bytes are the
    store's (``blob_bytes_redirected``), not the server's (``blob_bytes_served``)."""
    big, small = os.urandom(MIN * 2), os.urandom(100)
    with serve(s3_store, settings(tmp_path)) as client:
        for data in (big, small):
            assert client.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        assert client.get(f"/v1/blobs/{digest(big)}").status_code == 307
        assert client.get(f"/v1/blobs/{digest(small)}").status_code == 200
        found = samples(client)
    assert found[("neffcache_blob_reads_total", (("result", "hit"),))] == 2
    assert found[("neffcache_blob_redirects_total", ())] == 1
    assert found[("neffcache_blob_bytes_redirected_total", ())] == len(big)
    assert found[("neffcache_blob_bytes_served_total", ())] == len(small)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NEFFCACHE_BLOB_REDIRECT_SECONDS", "-1"),
        ("NEFFCACHE_BLOB_REDIRECT_SECONDS", str(7 * 86400 + 1)),
        ("NEFFCACHE_BLOB_REDIRECT_MIN_BYTES", "-1"),
    ],
)
def test_bad_redirect_settings_stop_start_up(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Nothing half-configured: a lifetime below 0 or over S3's 7 days, or a negative
    threshold, is refused at start-up with the setting's name."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name.removeprefix("NEFFCACHE_").lower()):
        load_settings()
