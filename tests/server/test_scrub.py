"""Blobs verified again although their files look unchanged (scrub.py): the scrub, on
a clock the tests move, one replica at a time and paced; clients' mismatch reports
(``POST /v1/blobs/{digest}/mismatch``); and ``fsck --verify``, which hashes every blob
whatever the memo says.

Rot beneath the filesystem changes no file stamp. It is simulated by damaging a file
and then telling the memo that its new stamp was verified: what a server that read
the blob before the disk rotted believes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from fastapi.testclient import TestClient

from neffcache.server import verified
from neffcache.server.app import create_app
from neffcache.server.auth import TokenPresence
from neffcache.server.blobs import open_blob_store
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.deps import Backends
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.metrics import Metrics
from neffcache.server.recovery.fsck import fsck
from neffcache.server.scrub import (
    IDLE,
    LEASE_TTL,
    MIN_COST,
    QUEUE,
    RECHECK_EVERY,
    Rechecks,
    Scrub,
    Verdict,
    verify,
)
from neffcache.server.services import durable
from neffcache.server.settings import ServerSettings
from neffcache.server.verified import VerifiedMemo

WEEK = 7 * 86400.0
RATE = 2**20  # bytes a second: the smallest scrub_bytes_per_second
ADMIN = "nfc_scrub_tests_admin_secret"


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


class Clock:
    """Seconds that pass only when a test, or a pace's sleep, says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.now += seconds
        self.slept += seconds
        return True


@pytest.fixture(autouse=True)
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # A file is remembered only once it is 2 s old; tests cannot wait for every blob.
    monkeypatch.setattr(verified, "_RACY", 0.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FsBlobStore]:
    opened = open_blob_store((tmp_path / "store").as_uri())
    assert isinstance(opened, FsBlobStore)
    yield opened
    opened.close()


def put(store: FsBlobStore, data: bytes) -> str:
    staged = store.staging_dir() / f"upload-{os.urandom(4).hex()}"
    staged.write_bytes(data)
    store.commit(staged, digest(data))
    return digest(data)


def rot(store: FsBlobStore, memo: VerifiedMemo, key: str) -> None:
    """Flip a byte of the blob's file, then have the memo trust its new stamp."""
    path = store.local_path(key)
    assert path is not None
    with open(path, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))
    stamped = store.stamp(key)
    assert stamped is not None
    memo.remember(key, stamped[0], stamped[1] - 10, time.time())
    assert memo.trusted(key, stamped[0])


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def trusted(store: FsBlobStore, memo: VerifiedMemo, key: str) -> bool:
    stamped = store.stamp(key)
    return stamped is not None and memo.trusted(key, stamped[0])


def settings(tmp_path: Path, **values: object) -> ServerSettings:
    values = {"scrub_interval_seconds": WEEK, "scrub_bytes_per_second": RATE, **values}
    return ServerSettings(data_dir=tmp_path / "data", **values)  # type: ignore[arg-type]


def new_scrub(
    store: FsBlobStore | MemoryBlobStore,
    index: MemoryIndex,
    clock: Clock,
    tmp_path: Path,
    memo: VerifiedMemo | None = None,
    **values: object,
) -> Scrub:
    return Scrub(
        store,
        index,
        memo or VerifiedMemo(3600),
        Metrics(lambda: []),
        settings(tmp_path, **values),
        clock=clock,
        monotonic=clock,
        sleep=clock.sleep,
    )


def test_a_pass_is_due_an_interval_after_the_store_is_first_seen_and_quarantines_rot(
    store: FsBlobStore, tmp_path: Path
) -> None:
    clock, index, memo = Clock(), MemoryIndex(), VerifiedMemo(3600)
    keys = [put(store, os.urandom(size)) for size in (10, 70_000, 3 * 2**20)]
    rot(store, memo, keys[1])
    scrub = new_scrub(store, index, clock, tmp_path, memo)

    assert scrub.tick() == IDLE  # first seen: nothing read now
    assert store.size(keys[1]) is not None
    state = scrub.state()
    assert state is not None
    assert (state.began, state.running, state.last_full_pass) == (clock.now, False, None)

    clock.now += WEEK
    scrub.tick()
    assert store.size(keys[1]) is None  # quarantined
    assert [p.name.split(".")[0] for p in (store.root / "quarantine").iterdir()] == [keys[1]]
    assert not memo.trusted(keys[1], ("anything",))
    assert trusted(store, memo, keys[0])
    assert trusted(store, memo, keys[2])
    done = scrub.state()
    assert done is not None
    assert not done.running
    assert done.last_full_pass == clock.now
    assert (done.blobs, done.mismatches) == (3, 1)
    metrics = scrub.metrics
    assert sample(metrics, "neffcache_scrub_blobs_total") == 3
    assert sample(metrics, "neffcache_blob_mismatches_total", found_by="scrub") == 1
    assert sample(metrics, "neffcache_scrub_last_full_pass_timestamp_seconds") == clock.now

    assert scrub.tick() == IDLE  # the next pass is a week away
    assert scrub.state() == done


def test_the_scrub_reads_no_faster_than_its_rate(store: FsBlobStore, tmp_path: Path) -> None:
    sizes = [5 * 2**20, 3 * 2**20, 100, 0]
    for size in sizes:
        put(store, os.urandom(size))
    clock = Clock()
    scrub = new_scrub(store, MemoryIndex(), clock, tmp_path)
    assert scrub.run_pass() is not None
    # A blob counts at least MIN_COST: a store of tiny files is not walked at full speed.
    assert clock.slept == pytest.approx(sum(max(s, MIN_COST) for s in sizes) / RATE)


def test_one_replica_scrubs_at_a_time_and_a_pass_cut_off_is_begun_again(
    store: FsBlobStore, tmp_path: Path
) -> None:
    clock, index = Clock(), MemoryIndex()
    keys = [put(store, os.urandom(2**20)) for _ in range(3)]
    first = new_scrub(store, index, clock, tmp_path)
    second = new_scrub(store, index, clock, tmp_path)
    first.tick()
    clock.now += WEEK
    assert first._lead()  # the first replica holds the lease (a pass under way)
    assert second.tick() == IDLE
    assert sample(second.metrics, "neffcache_scrub_blobs_total") == 0

    # The first replica stops mid-pass: the record says running, its lease lapses.
    stops = iter([True, False])
    first._sleep = lambda seconds: next(stops, False)
    assert first.run_pass() is None
    state = first.state()
    assert state is not None
    assert state.running
    clock.now += LEASE_TTL + 1
    second.tick()  # not a week later: the pass was cut off
    state = second.state()
    assert state is not None
    assert not state.running
    assert state.blobs == len(keys)
    assert sample(second.metrics, "neffcache_scrub_blobs_total") == len(keys)


def test_stores_that_hash_every_read_are_not_scrubbed(store: FsBlobStore, tmp_path: Path) -> None:
    memory = MemoryBlobStore()
    try:
        assert not new_scrub(memory, MemoryIndex(), Clock(), tmp_path).enabled
    finally:
        memory.close()
    assert not new_scrub(store, MemoryIndex(), Clock(), tmp_path, scrub_interval_seconds=0).enabled
    assert new_scrub(store, MemoryIndex(), Clock(), tmp_path).enabled


def test_a_blob_whose_file_changes_while_it_is_hashed_is_not_quarantined(
    store: FsBlobStore,
) -> None:
    key = put(store, os.urandom(3 * 2**20))
    path = store.local_path(key)
    assert path is not None
    # An old mtime: the write below changes it, whatever the filesystem clock's tick.
    os.utime(path, (1_000_000_000, 1_000_000_000))
    memo = VerifiedMemo(3600)

    def write_ahead(size: int) -> bool:
        with open(path, "r+b") as f:  # into the part not read yet
            f.seek(2 * 2**20 + 5)
            f.write(b"\0\1\2")
        return True

    assert verify(store, memo, Metrics(lambda: []), key, "scrub", write_ahead) is Verdict.CHANGED
    assert store.size(key) is not None
    assert not trusted(store, memo, key)


def test_a_report_drops_the_blob_from_the_memo_and_one_recheck_quarantines_it(
    store: FsBlobStore,
) -> None:
    clock, memo = Clock(), VerifiedMemo(3600)
    bad, good = put(store, os.urandom(5000)), put(store, os.urandom(5000))
    rot(store, memo, bad)
    stamped = store.stamp(good)
    assert stamped is not None
    memo.remember(good, stamped[0], stamped[1] - 10, time.time())
    rechecks = Rechecks(store, memo, Metrics(lambda: []), clock=clock, threaded=False)

    assert rechecks.report(bad) == "queued"
    assert not memo.trusted(bad, ("anything",))  # the next read hashes it, at once
    assert rechecks.report(good) == "queued"
    assert not trusted(store, memo, good)
    assert rechecks.run_pending() == 2
    assert store.size(bad) is None  # quarantined
    assert store.size(good) is not None
    assert trusted(store, memo, good)
    assert sample(rechecks.metrics, "neffcache_blob_mismatches_total", found_by="report") == 1

    # The same digest again within RECHECK_EVERY: nothing hashed, the memo kept.
    assert rechecks.report(good) == "recent"
    assert rechecks.run_pending() == 0
    assert trusted(store, memo, good)
    clock.now += RECHECK_EVERY
    assert rechecks.report(good) == "queued"


def test_reports_queue_at_most_a_bound() -> None:
    blobs = MemoryBlobStore()
    rechecks = Rechecks(blobs, VerifiedMemo(3600), Metrics(lambda: []), threaded=False)
    answers = [rechecks.report(f"{i:064x}") for i in range(QUEUE + 1)]
    assert answers == ["queued"] * QUEUE + ["busy"]
    assert rechecks.run_pending() == QUEUE  # absent blobs: nothing to judge
    assert rechecks.report(f"{QUEUE:064x}") == "queued"  # room again
    blobs.close()


@pytest.fixture
def app_client(store: FsBlobStore, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(
        ServerSettings(data_dir=tmp_path / "data", bootstrap_admin_token=ADMIN),
        blob_store=store,
        index=MemoryIndex(),
    )
    with TestClient(app) as client:
        yield client


def read_token(client: TestClient) -> dict[str, str]:
    answer = client.post(
        "/v1/admin/tokens",
        json={"scope": "read", "namespaces": ["team-a"]},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def test_a_mismatch_report_needs_a_read_token_and_quarantines_at_once(
    app_client: TestClient, store: FsBlobStore
) -> None:
    backends: Backends = app_client.app.state.backends  # type: ignore[attr-defined]
    rechecks: Rechecks = app_client.app.state.integrity.rechecks  # type: ignore[attr-defined]
    bad, good = put(store, os.urandom(5000)), put(store, os.urandom(5000))
    reader = read_token(app_client)
    assert app_client.get(f"/v1/blobs/{bad}", headers=reader).status_code == 200
    rot(store, backends.verified, bad)
    # Trusted: the rotten bytes are served unhashed, and the client finds them wrong.
    served = app_client.get(f"/v1/blobs/{bad}", headers=reader)
    assert served.status_code == 200
    assert digest(served.content) != bad

    assert app_client.post(f"/v1/blobs/{bad}/mismatch").status_code == 401
    answer = app_client.post(f"/v1/blobs/{bad}/mismatch", headers=reader)
    assert (answer.status_code, answer.json()) == (202, {"recheck": "queued"})
    assert rechecks.wait_idle(30)
    assert store.size(bad) is None
    assert app_client.get(f"/v1/blobs/{bad}", headers=reader).status_code == 404
    assert app_client.post(f"/v1/blobs/{bad}/mismatch", headers=reader).status_code == 404

    assert app_client.post(f"/v1/blobs/{good}/mismatch", headers=reader).status_code == 202
    assert rechecks.wait_idle(30)
    assert store.size(good) is not None  # sound: kept
    again = app_client.post(f"/v1/blobs/{good}/mismatch", headers=reader)
    assert again.json() == {"recheck": "recent"}
    metrics = app_client.get("/metrics").text
    assert 'neffcache_mismatch_reports_total{result="recent"} 1.0' in metrics
    assert 'neffcache_blob_mismatches_total{found_by="report"} 1.0' in metrics


def test_status_says_where_the_scrub_stands(app_client: TestClient, store: FsBlobStore) -> None:
    scrub: Scrub = app_client.app.state.integrity.scrub  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {ADMIN}"}
    assert app_client.get("/v1/status", headers=headers).json()["server"]["scrub"] == {
        "interval_seconds": WEEK,
        "running": False,
        "last_full_pass": None,
        "blobs": 0,
        "bytes": 0,
        "mismatches": 0,
    }
    put(store, b"one blob")
    done = scrub.run_pass()
    assert done is not None
    shown = app_client.get("/v1/status", headers=headers).json()["server"]["scrub"]
    assert (shown["last_full_pass"], shown["blobs"], shown["bytes"]) == (
        done.last_full_pass,
        1,
        len(b"one blob"),
    )


def test_fsck_verify_hashes_every_blob_whatever_the_memo_says(
    store: FsBlobStore, tmp_path: Path
) -> None:
    index = durable(MemoryIndex(), store)
    memo = VerifiedMemo(3600)
    backends = Backends(
        ServerSettings(data_dir=tmp_path / "data"),
        store,
        index,
        TokenPresence(index),
        verified=memo,
    )
    bad, good = put(store, os.urandom(5000)), put(store, os.urandom(5000))
    rot(store, memo, bad)
    report = fsck(backends, verify=True)
    assert report.verified == 2
    assert report.corrupt == [bad]
    assert good not in report.corrupt
