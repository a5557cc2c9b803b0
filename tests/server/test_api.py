"""The HTTP protocol (docs/protocol.md), through Starlette's TestClient (a real httpx
client driving the ASGI app), against every backend combination: in-memory, filesystem
+ SQLite, filesystem + a real redis-server, moto's S3 server + SQLite."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from support.api import ADDRESS, admin_token, digest, make_token, manifest, put_blob

from neffcache.server.app import create_app
from neffcache.server.auth import ensure_bootstrap_token
from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.errors import StoreFull
from neffcache.server.index import Index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings

# ``stores`` (tests/support/backends.py): each test once per backend pair.


def corrupt(blobs: BlobStore, key: str, data: bytes) -> None:
    """Replace stored bytes behind the store's back, as a failing disk would."""
    if isinstance(blobs, MemoryBlobStore):
        blobs.corrupt(key, data)
        return
    path = blobs.local_path(key)
    if path is None:
        pytest.skip("corruption at rest is simulated on local stores only")
    os.chmod(path, 0o644)
    path.write_bytes(data)


def flip_last(data: bytes) -> bytes:
    """``data`` with its last byte changed (a random last byte may already be 0)."""
    return data[:-1] + bytes([data[-1] ^ 1])


@pytest.fixture
def client(stores: tuple[BlobStore, Index], tmp_path: Any) -> Iterator[TestClient]:
    settings = ServerSettings(data_dir=tmp_path, max_blob_bytes=1 << 20)
    app = create_app(settings, blob_store=stores[0], index=stores[1])
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def checker(tmp_path: Any) -> Iterator[TestClient]:
    """The app over in-memory stores, for the many cases of one input check: a request
    refused before any store is asked answers the same over every backend, and the
    check itself runs once per case, not once per case and backend."""
    blobs = MemoryBlobStore()
    settings = ServerSettings(data_dir=tmp_path, max_blob_bytes=1 << 20)
    with TestClient(create_app(settings, blob_store=blobs, index=MemoryIndex())) as test_client:
        yield test_client
    blobs.close()


# --- blobs ------------------------------------------------------------------------------


def test_blob_round_trip_with_etag(client: TestClient) -> None:
    data = os.urandom(5000)
    assert put_blob(client, data) == 201
    assert put_blob(client, data) == 200
    got = client.get(f"/v1/blobs/{digest(data)}")
    assert got.status_code == 200
    assert got.content == data
    assert got.headers["etag"] == f'"{digest(data)}"'
    head = client.head(f"/v1/blobs/{digest(data)}")
    assert head.status_code == 200
    assert head.headers["content-length"] == "5000"


def test_blob_ranges(client: TestClient) -> None:
    data = bytes(range(256)) * 4
    put_blob(client, data)
    url = f"/v1/blobs/{digest(data)}"
    part = client.get(url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206
    assert part.content == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    assert client.get(url, headers={"Range": "bytes=-5"}).content == data[-5:]
    assert client.get(url, headers={"Range": "bytes=1000-"}).content == data[1000:]
    assert client.get(url, headers={"Range": "bytes=5000-"}).status_code == 416
    assert client.get(url, headers={"Range": "lines=1-2"}).status_code == 416


def test_absent_blob_is_404(client: TestClient) -> None:
    assert client.get(f"/v1/blobs/{'0' * 64}").status_code == 404
    assert client.head(f"/v1/blobs/{'0' * 64}").status_code == 404


@pytest.mark.parametrize("bad", ["abc", "G" * 64, "0" * 63, "0" * 65, "../" + "0" * 61])
def test_malformed_digest_is_400(checker: TestClient, bad: str) -> None:
    assert checker.get(f"/v1/blobs/{bad}").status_code in (400, 404)
    assert checker.put(f"/v1/blobs/{bad}", content=b"x").status_code in (400, 404, 405)


def test_lying_uploads_store_nothing(client: TestClient, stores: tuple[BlobStore, Index]) -> None:
    data = b"hello"
    wrong = client.put(f"/v1/blobs/{digest(b'other')}", content=data)
    assert wrong.status_code == 400
    assert "hashes to" in wrong.json()["detail"]
    short = client.put(f"/v1/blobs/{digest(data)}", content=data, headers={"Content-Length": "9"})
    assert short.status_code == 400
    assert stores[0].size(digest(data)) is None
    assert stores[0].size(digest(b"other")) is None
    assert list(stores[0].staging_dir().iterdir()) == []


def test_blob_over_the_limit_is_413(client: TestClient) -> None:
    data = b"x" * ((1 << 20) + 1)
    assert put_blob(client, data) == 413


def test_missing_lists_only_absent_digests(client: TestClient) -> None:
    present = b"present"
    put_blob(client, present)
    absent = digest(b"absent")
    response = client.post("/v1/blobs/missing", json={"digests": [digest(present), absent, absent]})
    assert response.json() == {"missing": [absent]}
    assert client.post("/v1/blobs/missing", json={"digests": ["nope"]}).status_code == 400


def test_corrupt_blob_is_never_served_and_heals(
    client: TestClient, stores: tuple[BlobStore, Index]
) -> None:
    data = b"compiled bytes" * 100
    put_blob(client, data)
    corrupt(stores[0], digest(data), b"X" + data[1:])
    assert client.get(f"/v1/blobs/{digest(data)}").status_code == 404
    assert stores[0].size(digest(data)) is None  # quarantined
    assert put_blob(client, data) == 201
    assert client.get(f"/v1/blobs/{digest(data)}").content == data


def test_large_corrupt_blob_never_completes(
    client: TestClient, stores: tuple[BlobStore, Index], tmp_path: Any
) -> None:
    data = os.urandom(17 * 2**20)  # above the verify-first size: streamed, last chunk held
    settings = ServerSettings(data_dir=tmp_path, max_blob_bytes=1 << 30)
    app = create_app(settings, blob_store=stores[0], index=stores[1])
    with TestClient(app) as big:
        assert put_blob(big, data) == 201
        assert big.get(f"/v1/blobs/{digest(data)}").content == data
        corrupt(stores[0], digest(data), flip_last(data))
        with pytest.raises(Exception, match=digest(data)):
            big.get(f"/v1/blobs/{digest(data)}")
    assert stores[0].size(digest(data)) is None


# --- entries ----------------------------------------------------------------------------


def test_entry_publish_lookup_and_immutability(client: TestClient) -> None:
    neff, hlo = b"NEFF" * 10, b"HLO" * 10
    put_blob(client, neff)
    put_blob(client, hlo)
    body = manifest(
        {"model.neff": neff, "model.hlo_module.pb": hlo},
        direct_key="b" * 64,
        neuron_address=ADDRESS,
        components={"target": "trn2"},
    )
    url = f"/v1/ns/team-a/entries/{'a' * 64}"
    assert client.put(url, json=body).status_code == 201
    assert client.put(url, json=body).status_code == 200
    changed = {**body, "compile_seconds": 99.0}
    conflict = client.put(url, json=changed)
    assert conflict.status_code == 409
    got = client.get(url).json()
    assert got["compile_seconds"] == 12.5
    assert got["writer"] == "anonymous"
    assert got["created_at"] > 0
    assert got["files"]["model.neff"]["digest"] == digest(neff)
    by_direct = client.get(f"/v1/ns/team-a/aliases/{'b' * 64}")
    assert by_direct.json()["key"] == "a" * 64
    by_address = client.get(f"/v1/ns/team-a/aliases/{ADDRESS}")
    assert by_address.json()["key"] == "a" * 64
    assert client.get(f"/v1/ns/team-b/entries/{'a' * 64}").status_code == 404


def test_absent_entry_says_why(client: TestClient) -> None:
    missing = client.get(f"/v1/ns/team-a/entries/{'c' * 64}")
    assert missing.status_code == 404
    assert missing.json()["reason"] == "absent"
    assert client.get(f"/v1/ns/team-a/aliases/{'d' * 64}").json()["reason"] == "absent"


def test_entry_naming_missing_blobs_is_400_with_the_list(client: TestClient) -> None:
    neff = b"neff"
    response = client.put(f"/v1/ns/team-a/entries/{'a' * 64}", json=manifest({"model.neff": neff}))
    assert response.status_code == 400
    assert response.json()["missing"] == [digest(neff)]


@pytest.mark.parametrize(
    "change",
    [
        {"key": "f" * 64},  # not the path's key
        {"files": {}},
        {"files": {"../model.neff": {"digest": "0" * 64, "size": 1}}},
        {"files": {"model.neff": {"digest": "xyz", "size": 1}}},
        {"neuron_address": "not/an/address"},
        {"compile_seconds": -1},
        {"direct_key": "short"},
        {"writer": "someone else"},  # the server sets it
        {"created_at": 0},
    ],
)
def test_invalid_manifests_are_400(checker: TestClient, change: dict[str, Any]) -> None:
    body = {**manifest({"model.neff": b"n"}), **change}
    response = checker.put(f"/v1/ns/team-a/entries/{'a' * 64}", json=body)
    assert response.status_code == 400
    assert response.json()["detail"]


def test_non_json_manifest_and_bad_namespace_are_400(client: TestClient) -> None:
    assert client.put(f"/v1/ns/team-a/entries/{'a' * 64}", content=b"{").status_code == 400
    body = json.dumps(manifest({"model.neff": b"n"}))
    assert client.put(f"/v1/ns/Team_A!/entries/{'a' * 64}", content=body).status_code == 400
    assert client.get(f"/v1/ns/team-a/aliases/{'a' * 63}").status_code == 400


# --- tokens and scopes ------------------------------------------------------------------


def test_authorization_matrix(client: TestClient, stores: tuple[BlobStore, Index]) -> None:
    admin = admin_token(client)  # anonymous may create the first token (no tokens yet)
    reader = make_token(client, admin, "read", ["team-a"])
    writer_a = make_token(client, admin, "write", ["team-a"])
    writer_b = make_token(client, admin, "write", ["team-b"])
    neff = b"neff bytes"
    entry = f"/v1/ns/team-a/entries/{'a' * 64}"

    def auth(token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    blob_url = f"/v1/blobs/{digest(neff)}"
    assert client.put(blob_url, content=neff).status_code == 401
    assert client.put(blob_url, content=neff, headers=auth("nfc_bogus_x")).status_code == 401
    assert client.put(blob_url, content=neff, headers=auth(reader)).status_code == 403
    assert client.put(blob_url, content=neff, headers=auth(writer_b)).status_code == 201
    body = manifest({"model.neff": neff})
    assert client.put(entry, json=body, headers=auth(writer_b)).status_code == 403
    assert client.put(entry, json=body, headers=auth(reader)).status_code == 403
    assert client.put(entry, json=body).status_code == 401
    assert client.put(entry, json=body, headers=auth(writer_a)).status_code == 201
    assert client.get(entry, headers=auth(reader)).status_code == 200
    assert client.get(entry, headers=auth(writer_b)).status_code == 403
    assert client.get(entry).status_code == 401
    # Only admin manages tokens.
    assert client.get("/v1/admin/tokens", headers=auth(writer_a)).status_code == 403
    listing = client.get("/v1/admin/tokens", headers=auth(admin)).json()["tokens"]
    assert len(listing) == 4
    assert all("token" not in t and "secret_hash" not in t for t in listing)
    reader_id = next(t["token_id"] for t in listing if t["scope"] == "read")
    assert client.delete(f"/v1/admin/tokens/{reader_id}", headers=auth(admin)).status_code == 204
    assert client.get(entry, headers=auth(reader)).status_code == 401
    # Secrets are stored only as hashes.
    assert all(reader not in repr(t) for t in stores[1].tokens())


def test_bootstrap_admin_token(stores: tuple[BlobStore, Index], tmp_path: Any) -> None:
    settings = ServerSettings(data_dir=tmp_path, bootstrap_admin_token="nfc_boot_secret")
    with TestClient(create_app(settings, blob_store=stores[0], index=stores[1])) as client:
        assert client.get("/v1/admin/tokens").status_code == 401
        ok = client.get("/v1/admin/tokens", headers={"Authorization": "Bearer nfc_boot_secret"})
        assert ok.status_code == 200
        assert ok.json()["tokens"][0]["scope"] == "admin"


# --- health and the schema ---------------------------------------------------------------


def test_health_ready_and_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/blobs/{digest}", "/v1/blobs/missing", "/v1/ns/{namespace}/entries/{key}"):
        assert path in paths


class FullStore(MemoryBlobStore):
    def commit(self, staged: Path, digest: str) -> bool:
        raise StoreFull("the blob store is out of space")


def test_out_of_space_is_507_with_nothing_kept(tmp_path: Path) -> None:
    blobs, index = FullStore(), MemoryIndex()
    app = create_app(ServerSettings(data_dir=tmp_path), blob_store=blobs, index=index)
    with TestClient(app) as client:
        data = b"no room for this"
        response = client.put(f"/v1/blobs/{digest(data)}", content=data)
        assert response.status_code == 507
        assert "out of space" in response.json()["detail"]
        assert list(blobs.staging_dir().iterdir()) == []
        assert blobs.size(digest(data)) is None
        assert client.get("/healthz").status_code == 200
    blobs.close()


# --- secrets, body limits and slow bodies -----------------------------------------------


def test_a_changed_bootstrap_secret_rotates_it(
    stores: tuple[BlobStore, Index], tmp_path: Path
) -> None:
    def app_with(secret: str) -> TestClient:
        settings = ServerSettings(data_dir=tmp_path, bootstrap_admin_token=secret)
        return TestClient(create_app(settings, blob_store=stores[0], index=stores[1]))

    old = {"Authorization": "Bearer nfc_old_secret"}
    new = {"Authorization": "Bearer nfc_new_secret"}
    with app_with("nfc_old_secret") as client:
        token_id = client.get("/v1/admin/tokens", headers=old).json()["tokens"][0]["token_id"]
        assert client.delete(f"/v1/admin/tokens/{token_id}", headers=old).status_code == 204
        assert client.get("/v1/admin/tokens", headers=old).status_code == 401
    with app_with("nfc_new_secret") as client:  # a restart with another secret
        assert client.get("/v1/admin/tokens", headers=new).status_code == 200
        assert client.get("/v1/admin/tokens", headers=old).status_code == 401
    with app_with("nfc_new_secret") as client:  # and again with the same one
        assert client.get("/v1/admin/tokens", headers=new).status_code == 200


def test_replicas_starting_together_share_the_bootstrap_token(
    stores: tuple[BlobStore, Index],
) -> None:
    """Two replicas with the same bootstrap secret, starting at once: each finds no
    token for it, and the one that writes second finds the other's. Neither fails to
    start, and there is one token."""
    index = stores[1]

    class Racing:
        """The index as the second replica sees it: its lookup before the first
        replica's write, everything else after."""

        looked = False

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

        def token_by_hash(self, secret_hash: str) -> Any:
            if not self.looked:
                self.looked = True
                assert ensure_bootstrap_token(index, "nfc_boot_secret")  # the first replica
                return None
            return index.token_by_hash(secret_hash)

    assert ensure_bootstrap_token(cast(Index, Racing()), "nfc_boot_secret") == []
    assert [t.name for t in index.tokens()] == ["bootstrap"]


def test_small_json_bodies_are_capped_and_read_after_the_token(client: TestClient) -> None:
    admin = admin_token(client)
    huge = b'{"digests": []}' + b" " * (2 << 20)
    assert client.post("/v1/blobs/missing", content=huge).status_code == 401
    authorized = {"Authorization": f"Bearer {admin}"}
    assert client.post("/v1/blobs/missing", content=huge, headers=authorized).status_code == 413
    big_token_request = b'{"scope": "read", "namespaces": ["a"], "name": "' + b"x" * 70_000 + b'"}'
    response = client.post("/v1/admin/tokens", content=big_token_request, headers=authorized)
    assert response.status_code == 413


def test_a_manifest_over_1_mib_is_413_even_when_chunked(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"key": "' + b"a" * 64 + b'", "pad": "'
        for _ in range(3):
            yield b"x" * (1 << 20)
        yield b'"}'

    response = client.put(f"/v1/ns/team-a/entries/{'a' * 64}", content=chunks())
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("NaN", "NaN"),
        ("1e999", "too large"),
        ("9" * 5000, "not JSON"),  # longer than Python reads an int
        ("[" * 100_000 + "]" * 100_000, "not JSON"),  # nested past the recursion limit
    ],
)
def test_json_that_python_reads_badly_is_400(checker: TestClient, value: str, why: str) -> None:
    neff = b"neff"
    put_blob(checker, neff)
    valid = json.dumps(manifest({"model.neff": neff}))
    assert checker.put(f"/v1/ns/team-b/entries/{'a' * 64}", content=valid).status_code == 201
    text = valid[:-1] + f', "extra": {value}}}'
    response = checker.put(f"/v1/ns/team-a/entries/{'a' * 64}", content=text)
    assert response.status_code == 400
    assert why in response.json()["detail"]


def test_a_lone_surrogate_in_a_manifest_is_kept_as_an_escape(client: TestClient) -> None:
    neff = b"neff"
    put_blob(client, neff)
    body = json.dumps(manifest({"model.neff": neff}, note="\ud800"))
    url = f"/v1/ns/team-a/entries/{'a' * 64}"
    assert client.put(url, content=body).status_code == 201
    got = client.get(url)
    assert got.status_code == 200
    assert got.json()["note"] == "\ud800"


def test_ranges_of_large_blobs_stream_and_are_verified(
    stores: tuple[BlobStore, Index], tmp_path: Path
) -> None:
    data = os.urandom(17 * 2**20)
    settings = ServerSettings(data_dir=tmp_path, max_blob_bytes=1 << 30)
    with TestClient(create_app(settings, blob_store=stores[0], index=stores[1])) as big:
        assert put_blob(big, data) == 201
        url = f"/v1/blobs/{digest(data)}"
        part = big.get(url, headers={"Range": "bytes=5-9"})
        assert part.status_code == 206
        assert part.content == data[5:10]
        assert big.get(url, headers={"Range": "bytes=" + "9" * 5000 + "-"}).status_code == 416
        corrupt(stores[0], digest(data), flip_last(data))
        assert big.get(url, headers={"Range": "bytes=5-9"}).status_code == 404


def test_a_stalled_body_times_out() -> None:
    import asyncio

    from neffcache.server.api.body import body_chunks
    from neffcache.server.errors import RequestTimeout

    class Stalling:
        async def stream(self) -> Any:
            yield b"first"
            await asyncio.sleep(10)
            yield b"never"

    async def drain() -> list[bytes]:
        return [chunk async for chunk in body_chunks(Stalling(), idle_seconds=0.05)]  # type: ignore[arg-type]

    with pytest.raises(RequestTimeout, match="stalled"):
        asyncio.run(drain())


# --- failure records ---------------------------------------------------------------------

FAILURES = f"/v1/ns/team-a/failures/{'a' * 64}"


def report(**extra: Any) -> dict[str, Any]:
    return {"compiler_version": "2.20.9961.0+0acef03a", **extra}


def test_failure_round_trip_with_every_field(client: TestClient) -> None:
    assert client.get(FAILURES).json() == {
        "detail": f"no recent failure of {'a' * 64} in namespace team-a",
        "reason": "absent",
    }
    sent = report(
        neuron_address=ADDRESS,
        direct_key="b" * 64,
        components={"target": "trn2", "flags": ["--model-type=transformer"], "env": {}},
        exit_code=-9,
        compile_seconds=812,
        log="error: out of memory\n",
        host="trn2-node-17",
        job_id="slurm-4411",
    )
    put = client.put(FAILURES, json=sent)
    assert put.status_code == 201
    stored = put.json()
    stamps = {"namespace", "key", "created_at", "writer", "log_truncated"}
    assert {k: v for k, v in stored.items() if k not in stamps} == sent
    assert stored["namespace"] == "team-a"
    assert stored["key"] == "a" * 64
    assert stored["writer"] == "anonymous"
    assert stored["log_truncated"] is False
    assert abs(stored["created_at"] - time.time()) < 60
    got = client.get(FAILURES)
    assert got.status_code == 200
    assert got.json() == {"failures": [stored]}
    assert client.get(f"/v1/ns/team-b/failures/{'a' * 64}").status_code == 404
    assert client.get(f"/v1/ns/team-a/failures/{'b' * 64}").status_code == 404


def test_only_compiler_version_is_required(client: TestClient) -> None:
    stored = client.put(FAILURES, json=report()).json()
    assert set(stored) == {
        "compiler_version",
        "namespace",
        "key",
        "created_at",
        "writer",
        "log_truncated",
    }
    missing = client.put(FAILURES, json={"exit_code": 1})
    assert missing.status_code == 400
    assert "compiler_version" in missing.json()["detail"]


def test_failures_come_newest_first(client: TestClient) -> None:
    for job in ("job-0", "job-1", "job-2"):
        assert client.put(FAILURES, json=report(job_id=job)).status_code == 201
    records = client.get(FAILURES).json()["failures"]
    assert [r["job_id"] for r in records] == ["job-2", "job-1", "job-0"]
    assert records[0]["created_at"] >= records[1]["created_at"] >= records[2]["created_at"]


def test_a_long_log_keeps_its_last_64_kib(client: TestClient) -> None:
    lines = [f"line {i}: compiling\n" for i in range(12_000)]
    log = "".join(lines)[: 200 * 1024 - 19] + "error: NCC_EVRF001\n"
    assert len(log) == 200 * 1024
    stored = client.put(FAILURES, json=report(log=log)).json()
    assert stored["log_truncated"] is True
    assert stored["log"] == log[-64 * 1024 :]
    assert client.get(FAILURES).json()["failures"][0]["log"] == log[-64 * 1024 :]


def test_a_log_is_cut_between_characters(client: TestClient) -> None:
    # 100,000 bytes of two-byte characters, then 11 bytes: the cut falls inside an "é".
    log = "é" * 50_000 + "🚀 errors"
    stored = client.put(FAILURES, json=report(log=log)).json()
    kept: str = stored["log"]
    assert stored["log_truncated"] is True
    assert log.endswith(kept)
    assert len(kept.encode()) == 64 * 1024 - 1
    exact = "x" * (64 * 1024)
    assert client.put(FAILURES, json=report(log=exact)).json()["log_truncated"] is False


def test_failure_records_are_kept_per_key_under_concurrent_writers(
    client: TestClient, stores: tuple[BlobStore, Index]
) -> None:
    writers = 20

    def put(i: int) -> int:
        status: int = client.put(FAILURES, json=report(job_id=f"job-{i}")).status_code
        return status

    with ThreadPoolExecutor(max_workers=writers) as pool:
        assert list(pool.map(put, range(writers), timeout=60)) == [201] * writers
    records = client.get(FAILURES).json()["failures"]
    assert len(records) == 5  # failures_per_key's default
    assert len({r["job_id"] for r in records}) == 5
    # And no more are stored than served.
    assert len(stores[1].failures("team-a", "a" * 64, now=0.0)) == 5


def test_failure_records_expire(stores: tuple[BlobStore, Index], tmp_path: Path) -> None:
    settings = ServerSettings(data_dir=tmp_path, failure_ttl_seconds=0.6, failures_per_key=2)
    with TestClient(create_app(settings, blob_store=stores[0], index=stores[1])) as client:
        for job in ("old-0", "old-1", "old-2"):
            client.put(FAILURES, json=report(job_id=job))
        records = client.get(FAILURES).json()["failures"]
        assert [r["job_id"] for r in records] == ["old-2", "old-1"]
        time.sleep(0.7)
        gone = client.get(FAILURES)
        assert gone.status_code == 404
        assert gone.json()["reason"] == "absent"
        assert client.put(FAILURES, json=report(job_id="new")).status_code == 201
        assert [r["job_id"] for r in client.get(FAILURES).json()["failures"]] == ["new"]
    # Expired records are deleted, not only hidden.
    assert len(stores[1].failures("team-a", "a" * 64, now=0.0)) == 1


def test_a_lowered_keep_applies_to_reads_at_once(
    client: TestClient, stores: tuple[BlobStore, Index], tmp_path: Path
) -> None:
    for job in ("job-0", "job-1", "job-2"):
        client.put(FAILURES, json=report(job_id=job))
    settings = ServerSettings(data_dir=tmp_path, failures_per_key=2)
    with TestClient(create_app(settings, blob_store=stores[0], index=stores[1])) as lowered:
        records = lowered.get(FAILURES).json()["failures"]
        assert [r["job_id"] for r in records] == ["job-2", "job-1"]


def test_failure_records_need_the_namespace_and_scope(client: TestClient) -> None:
    admin = admin_token(client)
    reader = make_token(client, admin, "read", ["team-a"])
    writer_a = make_token(client, admin, "write", ["team-a"])
    writer_b = make_token(client, admin, "write", ["team-b"])

    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    assert client.put(FAILURES, json=report()).status_code == 401
    assert client.put(FAILURES, json=report(), headers=auth("nfc_bogus_x")).status_code == 401
    assert client.put(FAILURES, json=report(), headers=auth(reader)).status_code == 403
    assert client.put(FAILURES, json=report(), headers=auth(writer_b)).status_code == 403
    stored = client.put(FAILURES, json=report(), headers=auth(writer_a))
    assert stored.status_code == 201
    writer_a_id = next(
        t["token_id"]
        for t in client.get("/v1/admin/tokens", headers=auth(admin)).json()["tokens"]
        if t["scope"] == "write" and t["namespaces"] == ["team-a"]
    )
    assert stored.json()["writer"] == writer_a_id
    assert client.get(FAILURES).status_code == 401
    assert client.get(FAILURES, headers=auth(writer_b)).status_code == 403
    assert client.get(FAILURES, headers=auth(reader)).status_code == 200
    # A body is read only once the token is known: a huge one without a token is 401.
    huge = b'{"compiler_version": "x", "log": "' + b"x" * (2 << 20) + b'"}'
    assert client.put(FAILURES, content=huge).status_code == 401


@pytest.mark.parametrize("bad", ["A" * 64, "0" * 63, "0" * 65, "g" * 64, "../" + "0" * 61])
def test_malformed_failure_keys_and_namespaces_are_refused(checker: TestClient, bad: str) -> None:
    assert checker.put(f"/v1/ns/team-a/failures/{bad}", json=report()).status_code in (400, 404)
    assert checker.get(f"/v1/ns/team-a/failures/{bad}").status_code in (400, 404)
    assert checker.put(f"/v1/ns/Team_A!/failures/{'a' * 64}", json=report()).status_code == 400


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"bogus": 1, "hostname": "x"}, "bogus, hostname"),
        ({"writer": "someone else"}, "server sets writer"),
        ({"created_at": 0, "log_truncated": False}, "created_at, log_truncated"),
        ({"key": "a" * 64}, "server sets key"),
        ({"compiler_version": ""}, "compiler_version"),
        ({"compiler_version": 2.2}, "compiler_version"),
        ({"exit_code": "1"}, "exit_code"),  # strict: no coercion
        ({"exit_code": True}, "exit_code"),
        ({"exit_code": 2**63}, "exit_code"),
        ({"exit_code": 256}, "exit_code"),  # no exit status: a replay would exit 0
        ({"exit_code": -256}, "exit_code"),
        ({"compile_seconds": -1}, "compile_seconds"),
        ({"direct_key": "short"}, "direct_key"),
        ({"neuron_address": "not/an/address"}, "neuron_address"),
        ({"components": ["not", "an", "object"]}, "components"),
        ({"host": "h" * 256}, "host"),
        ({"job_id": "j" * 256}, "job_id"),
        ({"log": 42}, "log"),
    ],
)
def test_invalid_failure_reports_are_400_naming_the_field(
    checker: TestClient, change: dict[str, Any], named: str
) -> None:
    response = checker.put(FAILURES, json={**report(), **change})
    assert response.status_code == 400
    assert named in response.json()["detail"]
    assert checker.get(FAILURES).status_code == 404  # nothing stored


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"compiler_version": "x", "compile_seconds": NaN}', "NaN"),
        (b'{"compiler_version": "x", "compile_seconds": Infinity}', "Infinity"),
        (b'{"compiler_version": "x", "compile_seconds": 1e999}', "too large"),
        (b'{"compiler_version": "x", "exit_code": ' + b"9" * 5000 + b"}", "not JSON"),
        (b"{", "not JSON"),
        (b'["compiler_version"]', "JSON object"),
    ],
)
def test_failure_reports_python_reads_badly_are_400(
    checker: TestClient, body: bytes, why: str
) -> None:
    response = checker.put(FAILURES, content=body)
    assert response.status_code == 400
    assert why in response.json()["detail"]


def test_a_failure_report_over_1_mib_is_413(client: TestClient) -> None:
    body = json.dumps(report(log="x" * (1 << 20))).encode()
    assert client.put(FAILURES, content=body).status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'{"compiler_version": "x", "log": "'
        for _ in range(3):
            yield b"x" * (1 << 20)
        yield b'"}'

    assert client.put(FAILURES, content=chunks()).status_code == 413
    # Just under the cap is accepted, and its log cut.
    fits = json.dumps(report(log="x" * ((1 << 20) - 100))).encode()
    assert client.put(FAILURES, content=fits).json()["log_truncated"] is True


def test_failures_never_change_entries(client: TestClient) -> None:
    entry_url = f"/v1/ns/team-a/entries/{'a' * 64}"
    assert client.put(FAILURES, json=report(direct_key="b" * 64)).status_code == 201
    # A failure is never a hit, by key or by alias.
    assert client.get(entry_url).status_code == 404
    assert client.get(entry_url).json()["reason"] == "absent"
    assert client.get(f"/v1/ns/team-a/aliases/{'b' * 64}").status_code == 404
    neff = b"neff after a failure"
    put_blob(client, neff)
    body = manifest({"model.neff": neff}, direct_key="b" * 64)
    assert client.put(entry_url, json=body).status_code == 201
    published = client.get(entry_url)
    assert published.status_code == 200
    assert client.put(FAILURES, json=report(job_id="later")).status_code == 201
    assert client.get(entry_url).content == published.content
    assert client.get(f"/v1/ns/team-a/aliases/{'b' * 64}").json()["key"] == "a" * 64
    assert client.put(entry_url, json=body).status_code == 200  # still the same entry
    assert len(client.get(FAILURES).json()["failures"]) == 2


def test_failure_routes_are_in_the_schema(client: TestClient) -> None:
    route = client.get("/openapi.json").json()["paths"]["/v1/ns/{namespace}/failures/{key}"]
    assert set(route) == {"get", "put"}
    schema = route["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["compiler_version"]
    assert schema["additionalProperties"] is False


# --- failure records --------------------------------------------------------------------


def test_a_failure_record_over_256_kib_is_413_and_nothing_is_stored(client: TestClient) -> None:
    # Records are read back up to failures_per_key at a time and handled whole by one
    # Redis script or SQLite transaction: their size is bounded, not just the body's.
    big = report(components={"notes": ["y" * 1000] * 300})
    response = client.put(FAILURES, json=big)
    assert response.status_code == 413
    assert "256" in response.json()["detail"] or "262144" in response.json()["detail"]
    assert client.get(FAILURES).status_code == 404


def test_a_failure_log_keeps_its_text_not_its_colour_codes(client: TestClient) -> None:
    log = "\x1b[31merror:\x1b[0m out of memory\x00\n\tat pass 3\n"
    stored = client.put(FAILURES, json=report(log=log)).json()
    assert stored["log"] == "error: out of memory\n\tat pass 3\n"


def test_a_failure_log_in_another_script_is_stored_unescaped(client: TestClient) -> None:
    # 60 KiB of CJK text: escaped as \\uXXXX it would be 3x its UTF-8 size and over the
    # record limit; stored as UTF-8 it fits.
    log = "内存不足" * 5000
    response = client.put(FAILURES, json=report(log=log))
    assert response.status_code == 201
    assert response.json()["log"] == log


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"compiler_version": "a\nb"}, "compiler_version"),
        ({"compiler_version": "2.20"}, "compiler_version"),
    ],
)
def test_a_failure_report_names_a_real_compiler_version(
    client: TestClient, change: dict[str, Any], named: str
) -> None:
    response = client.put(FAILURES, json=report(**change))
    assert response.status_code == 400
    assert named in response.json()["detail"]


def test_a_lone_surrogate_in_a_failure_log_is_400(client: TestClient) -> None:
    body = b'{"compiler_version": "2.20.9961.0+0acef03a", "log": "bad \\ud800 text"}'
    response = client.put(FAILURES, content=body)
    assert response.status_code == 400
    assert "Unicode" in response.json()["detail"]
    assert client.get(FAILURES).status_code == 404


# --- adding an alias to an existing entry -----------------------------------------------


def published(client: TestClient, key: str = "a" * 64, **extra: Any) -> str:
    neff = b"NEFF for " + key.encode()
    put_blob(client, neff)
    url = f"/v1/ns/team-a/entries/{key}"
    assert client.put(url, json=manifest({"model.neff": neff}, key=key, **extra)).status_code == 201
    return key


def test_put_alias_adds_one_and_keeps_the_first_key(client: TestClient) -> None:
    key = published(client)
    other = published(client, "c" * 64, neuron_address=ADDRESS.replace("+3cc9a3cb", "+00000000"))
    for alias in (ADDRESS, "b" * 64):
        url = f"/v1/ns/team-a/aliases/{alias}"
        assert client.put(url, json={"key": key}).status_code == 201
        assert client.put(url, json={"key": key}).status_code == 200
        conflict = client.put(url, json={"key": other})
        assert conflict.status_code == 409
        assert "another key" in conflict.json()["detail"]
        found = client.get(url)
        assert found.status_code == 200
        assert found.json() == client.get(f"/v1/ns/team-a/entries/{key}").json()
    # An address an entry was published with keeps its key too.
    taken = f"/v1/ns/team-a/aliases/{ADDRESS.replace('+3cc9a3cb', '+00000000')}"
    assert client.put(taken, json={"key": key}).status_code == 409
    assert client.get(taken).json()["key"] == other


def test_put_alias_of_a_key_without_an_entry_is_404(client: TestClient) -> None:
    published(client)
    missing = client.put(f"/v1/ns/team-a/aliases/{ADDRESS}", json={"key": "c" * 64})
    assert missing.status_code == 404
    assert missing.json()["reason"] == "absent"
    other_ns = client.put(f"/v1/ns/team-b/aliases/{ADDRESS}", json={"key": "a" * 64})
    assert other_ns.status_code == 404
    assert client.get(f"/v1/ns/team-a/aliases/{ADDRESS}").status_code == 404


@pytest.mark.parametrize(
    ("alias", "body"),
    [
        ("resnet", {"key": "a" * 64}),  # neither a direct key nor an address
        ("A" * 64, {"key": "a" * 64}),
        (ADDRESS, {"key": "A" * 64}),
        (ADDRESS, {"key": "a" * 63}),
        (ADDRESS, {"key": "a" * 64, "extra": 1}),
        (ADDRESS, {}),
        (ADDRESS, ["a" * 64]),
        (ADDRESS, "not json"),
    ],
)
def test_put_alias_refuses_a_bad_alias_or_body(checker: TestClient, alias: str, body: Any) -> None:
    published(checker)
    url = f"/v1/ns/team-a/aliases/{alias}"
    content = body if isinstance(body, str) else json.dumps(body)
    response = checker.put(url, content=content)
    assert response.status_code == 400
    assert response.json()["detail"]
    assert checker.get(f"/v1/ns/team-a/aliases/{ADDRESS}").status_code == 404


def test_put_alias_needs_a_write_token_for_the_namespace(client: TestClient) -> None:
    key = published(client)  # before any token exists
    admin = admin_token(client)
    reader = make_token(client, admin, "read", ["team-a"])
    writer_b = make_token(client, admin, "write", ["team-b"])
    writer_a = make_token(client, admin, "write", ["team-a"])
    url = f"/v1/ns/team-a/aliases/{ADDRESS}"
    for token, status in [(None, 401), (reader, 403), (writer_b, 403), (writer_a, 201)]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert client.put(url, json={"key": key}, headers=headers).status_code == status


def test_a_trailing_slash_is_404_never_a_redirect(client: TestClient) -> None:
    for path in ("/v1/ns/team-a/entries/", "/healthz/", "/v1/admin/namespaces/"):
        answer = client.get(path, headers={"Host": "evil.example"}, follow_redirects=False)
        assert answer.status_code == 404, path
        assert "location" not in answer.headers
