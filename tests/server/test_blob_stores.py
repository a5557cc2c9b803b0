"""One contract suite run against every BlobStore (memory, fs, S3 on a moto server),
then what only one backend promises, then the URL registry."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from support.backends import BLOB_STORES, backends

from neffcache.server.blobs import BlobInfo, BlobStore, open_blob_store
from neffcache.server.blobs import fs as fs_module
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError, StoreFull

MiB = 1 << 20


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def digest_of(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def stage(store: BlobStore, data: bytes) -> tuple[Path, str]:
    """Write ``data`` as the server would: a fresh file in the store's staging dir."""
    staged = store.staging_dir() / f"upload-{uuid.uuid4().hex}"
    staged.write_bytes(data)
    return staged, digest_of(data)


def put(store: BlobStore, data: bytes) -> str:
    staged, digest = stage(store, data)
    assert store.commit(staged, digest) is True
    return digest


def read_all(store: BlobStore, digest: str, start: int = 0, end: int | None = None) -> bytes | None:
    chunks = store.read(digest, start, end)
    return None if chunks is None else b"".join(chunks)


@pytest.fixture(params=backends(*BLOB_STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "filesystem":
        url = (tmp_path / "store").as_uri()
    else:
        url = request.getfixturevalue("s3_bucket")
    opened = open_blob_store(url)
    yield opened
    opened.close()


# --- the contract ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, MiB + 3])
def test_commit_then_size_and_read_round_trip(store: BlobStore, size: int) -> None:
    data = random_bytes(size, seed=size)
    staged, digest = stage(store, data)

    assert store.commit(staged, digest) is True
    assert not staged.exists()
    assert store.size(digest) == size
    chunks = list(store.read(digest) or [])
    assert b"".join(chunks) == data
    assert all(len(chunk) <= MiB for chunk in chunks)


def test_read_ranges(store: BlobStore) -> None:
    data = random_bytes(MiB + 3)
    digest = put(store, data)
    size = len(data)
    ranges = [
        (0, None),
        (0, 1),
        (5, 10),
        (MiB - 2, MiB + 2),  # across the chunk boundary
        (MiB, None),
        (10, size + 100),  # end past the size
        (size - 1, None),
        (size, None),
        (size + 5, size + 10),
        (7, 7),
        (9, 3),
    ]

    got = {r: read_all(store, digest, *r) for r in ranges}

    assert got == {(start, end): data[start:end] for start, end in ranges}


def test_commit_of_existing_digest_returns_false_and_removes_staged(store: BlobStore) -> None:
    data = random_bytes(1000)
    put(store, data)
    staged, digest = stage(store, data)

    assert store.commit(staged, digest) is False
    assert not staged.exists()
    assert read_all(store, digest) == data


def test_absent_digest_is_a_miss(store: BlobStore) -> None:
    put(store, b"something else")
    digest = digest_of(b"never stored")

    assert store.size(digest) is None
    assert store.read(digest) is None
    assert store.read(digest, 3, 7) is None
    assert store.local_path(digest) is None
    assert store.delete(digest) is False
    store.quarantine(digest)  # nothing to move: not an error
    assert store.size(digest) is None


def test_delete(store: BlobStore) -> None:
    digest = put(store, b"to be deleted")

    assert store.delete(digest) is True
    assert store.size(digest) is None
    assert store.read(digest) is None
    assert store.delete(digest) is False


def test_quarantine_makes_absent_and_recommit_heals(store: BlobStore) -> None:
    data = random_bytes(4096)
    digest = put(store, data)

    store.quarantine(digest)

    assert store.size(digest) is None
    assert store.read(digest) is None
    assert store.local_path(digest) is None
    staged, _ = stage(store, data)
    assert store.commit(staged, digest) is True
    assert read_all(store, digest) == data


def test_concurrent_commits_of_one_digest(store: BlobStore) -> None:
    data = random_bytes(256 * 1024 + 1)
    staged = [stage(store, data) for _ in range(8)]
    barrier = threading.Barrier(len(staged), timeout=30)

    def commit(path: Path, digest: str) -> bool:
        barrier.wait()
        return store.commit(path, digest)

    with ThreadPoolExecutor(len(staged)) as pool:
        results = [f.result() for f in [pool.submit(commit, *item) for item in staged]]

    assert sorted(results) == [False] * 7 + [True]
    assert list(store.staging_dir().iterdir()) == []
    assert read_all(store, staged[0][1]) == data


def test_local_path_is_none_or_holds_the_blob(store: BlobStore) -> None:
    data = random_bytes(100)
    digest = put(store, data)

    path = store.local_path(digest)

    expected = data if isinstance(store, FsBlobStore) else None
    assert (path.read_bytes() if path is not None else None) == expected


def test_check_passes_on_a_working_store(store: BlobStore) -> None:
    store.check()


# File and object timestamps may be truncated to the second (S3) or come from a coarse
# kernel clock a few ms behind time.time() (filesystems); a wrong clock or unit is far
# outside this.
_CLOCK_SLACK = 1.0


def listed(store: BlobStore) -> dict[str, int]:
    """digest -> size of every blob ``blobs()`` lists; fails on a digest listed twice."""
    infos = list(store.blobs())
    assert all(isinstance(info, BlobInfo) for info in infos)
    digests = [info.digest for info in infos]
    assert len(digests) == len(set(digests))
    return {info.digest: info.size for info in infos}


def test_blobs_of_an_empty_store_lists_nothing(store: BlobStore) -> None:
    assert list(store.blobs()) == []


def test_blobs_lists_what_was_put_with_sizes_and_times(store: BlobStore) -> None:
    datas = [b"", b"x", random_bytes(5000, seed=1), random_bytes(MiB + 3, seed=2)]
    started = time.time()
    digests = [put(store, data) for data in datas]
    finished = time.time()

    infos = list(store.blobs())

    assert sorted((i.digest, i.size) for i in infos) == sorted(
        (digest, len(data)) for digest, data in zip(digests, datas, strict=True)
    )
    for info in infos:
        assert started - _CLOCK_SLACK <= info.modified <= finished + _CLOCK_SLACK, info


def test_blobs_omits_deleted_and_quarantined_blobs(store: BlobStore) -> None:
    kept, deleted, quarantined = (put(store, f"blob {i}".encode()) for i in range(3))
    store.delete(deleted)
    store.quarantine(quarantined)

    assert listed(store) == {kept: len(b"blob 0")}


def test_blobs_omits_staged_uploads(store: BlobStore) -> None:
    kept = put(store, b"committed")
    staged, digest = stage(store, b"staged, never committed")
    # Named like a blob, to catch a listing that looks at names under the wrong root.
    staged.rename(staged.with_name(digest))

    assert listed(store) == {kept: len(b"committed")}


def test_blobs_tolerates_deletes_during_the_listing(store: BlobStore) -> None:
    digests = {put(store, f"blob {i}".encode()) for i in range(6)}

    listing = store.blobs()
    first = next(listing)
    for digest in digests - {first.digest}:
        store.delete(digest)
    rest = list(listing)

    # Deleted blobs may or may not appear, but nothing else may, nor an error.
    assert first.digest in digests
    assert {info.digest for info in rest} <= digests - {first.digest}


# --- filesystem -----------------------------------------------------------------------


@pytest.fixture
def fs_root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def fs_store(fs_root: Path) -> Iterator[FsBlobStore]:
    opened = FsBlobStore(fs_root)
    yield opened
    opened.close()


def files_named(root: Path, name: str) -> list[Path]:
    return [path for path in root.rglob("*") if path.name == name]


def test_fs_layout_fans_out_by_first_two_digits(fs_store: FsBlobStore, fs_root: Path) -> None:
    data = random_bytes(10)
    digest = put(fs_store, data)

    blob = fs_root / "blobs" / digest[:2] / digest
    assert blob.read_bytes() == data
    assert fs_store.local_path(digest) == blob
    assert files_named(fs_root, digest) == [blob]


def test_fs_staging_is_on_the_store_filesystem(fs_store: FsBlobStore, fs_root: Path) -> None:
    staging = fs_store.staging_dir()
    assert staging.is_relative_to(fs_root / "staging")
    assert staging.stat().st_dev == (fs_root / "blobs").stat().st_dev


_KILLED_UPLOAD = """
import os, signal, sys
from pathlib import Path
from neffcache.server.blobs.fs import FsBlobStore

store = FsBlobStore(Path(sys.argv[1]))
partial = store.staging_dir() / "upload-partial"
partial.write_bytes(b"half an upl")
print(partial, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.e2e
def test_fs_leftovers_of_a_killed_process_are_removed_on_start(fs_root: Path) -> None:
    server_root = Path(fs_module.__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(server_root)}
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_UPLOAD, str(fs_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = Path(killed.stdout.strip())
    assert partial.exists()  # what a killed upload leaves
    loose = fs_root / "staging" / "stray-file"
    loose.write_bytes(b"x")

    store = FsBlobStore(fs_root)
    try:
        assert not partial.exists()
        assert not partial.parent.parent.exists()
        assert not loose.exists()
        assert [p.name for p in (fs_root / "staging").iterdir()] == [
            store.staging_dir().parent.name
        ]
    finally:
        store.close()


def test_fs_only_stale_half_built_staging_areas_are_removed(fs_root: Path) -> None:
    # A process killed while setting up its area leaves a ".setup-" directory; a live
    # one renames it within microseconds, so only an old one is removed.
    staging = fs_root / "staging"
    stale, fresh = staging / ".setup-stale", staging / ".setup-fresh"
    stale.mkdir(parents=True)
    fresh.mkdir()
    day_ago = time.time() - 86400
    os.utime(stale, (day_ago, day_ago))

    FsBlobStore(fs_root).close()

    assert not stale.exists()
    assert fresh.exists()


def test_fs_opening_a_store_keeps_a_live_store_staging(
    fs_store: FsBlobStore, fs_root: Path
) -> None:
    in_flight = fs_store.staging_dir() / "upload-in-flight"
    in_flight.write_bytes(b"still uploading")

    second = FsBlobStore(fs_root)
    try:
        assert in_flight.read_bytes() == b"still uploading"
        assert second.staging_dir() != fs_store.staging_dir()
    finally:
        second.close()
    assert not second.staging_dir().exists()
    assert in_flight.exists()


def test_fs_failed_commit_leaves_no_blob(fs_store: FsBlobStore, fs_root: Path) -> None:
    # Root ignores permission bits, so a read-only blobs directory would not fail here;
    # a file where the fan-out directory belongs is a real failure for any user.
    data = b"cannot be published"
    staged, digest = stage(fs_store, data)
    (fs_root / "blobs" / digest[:2]).write_bytes(b"in the way")

    with pytest.raises(StoreError) as raised:
        fs_store.commit(staged, digest)

    assert not isinstance(raised.value, StoreFull)
    assert not staged.exists()
    assert files_named(fs_root, digest) == []


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EIO])
def test_fs_os_error_on_publish_is_store_error(
    fs_store: FsBlobStore, fs_root: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # What a read-only blobs directory does for a user other than root.
    staged, digest = stage(fs_store, b"refused")
    monkeypatch.setattr(os, "link", _raiser(code))

    with pytest.raises(StoreError) as raised:
        fs_store.commit(staged, digest)

    assert not isinstance(raised.value, StoreFull)
    assert list(fs_store.staging_dir().iterdir()) == []
    assert files_named(fs_root, digest) == []
    assert fs_store.size(digest) is None


def _raiser(code: int) -> object:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize(
    ("function", "code"),
    [("link", errno.ENOSPC), ("link", errno.EDQUOT), ("fsync", errno.ENOSPC)],
)
def test_fs_out_of_space_is_store_full_and_leaves_nothing(
    fs_store: FsBlobStore,
    fs_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    function: str,
    code: int,
) -> None:
    staged, digest = stage(fs_store, random_bytes(5000))
    monkeypatch.setattr(os, function, _raiser(code))

    with pytest.raises(StoreFull):
        fs_store.commit(staged, digest)

    monkeypatch.undo()
    assert list(fs_store.staging_dir().iterdir()) == []
    assert files_named(fs_root, digest) == []
    assert fs_store.size(digest) is None


@pytest.mark.parametrize(
    "url",
    [
        "file://",
        "file://relative/path",
        "file://./store",
        "file:///srv/store?mode=ro",
        "file:relative",  # no "://": the registry's own message
    ],
)
def test_fs_url_validation(url: str) -> None:
    with pytest.raises(ConfigError, match="file:///"):
        open_blob_store(url)


def test_fs_url_creates_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "a b" / "store"  # a space: percent-encoded in the URL

    store = open_blob_store(root.as_uri())
    try:
        assert (root / "blobs").is_dir()
        assert put(store, b"x") == digest_of(b"x")
    finally:
        store.close()


def test_fs_quarantine_moves_the_file(fs_store: FsBlobStore, fs_root: Path) -> None:
    data = random_bytes(300)
    digest = put(fs_store, data)

    fs_store.quarantine(digest)

    assert not (fs_root / "blobs" / digest[:2] / digest).exists()
    moved = list((fs_root / "quarantine").iterdir())
    assert [p.name.partition(".")[0] for p in moved] == [digest]
    assert moved[0].read_bytes() == data


def test_fs_read_started_before_quarantine_streams_whole(fs_store: FsBlobStore) -> None:
    data = random_bytes(3 * MiB)
    digest = put(fs_store, data)

    chunks = fs_store.read(digest)
    fs_store.quarantine(digest)

    assert chunks is not None
    assert b"".join(chunks) == data


def test_fs_check_fails_without_a_blobs_directory(fs_store: FsBlobStore, fs_root: Path) -> None:
    shutil.rmtree(fs_root / "blobs")
    (fs_root / "blobs").write_bytes(b"not a directory")

    with pytest.raises(StoreError):
        fs_store.check()


def test_fs_check_fails_without_staging(fs_store: FsBlobStore) -> None:
    shutil.rmtree(fs_store.staging_dir())

    with pytest.raises(StoreError):
        fs_store.check()


def plant(fs_root: Path, name: str, data: bytes = b"x", fanout: str | None = None) -> Path:
    """A file written straight into the blob tree, behind the store's back."""
    path = fs_root / "blobs" / (name[:2] if fanout is None else fanout) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_fs_blobs_ignores_strays_in_the_blob_tree(fs_store: FsBlobStore, fs_root: Path) -> None:
    digest = put(fs_store, b"the only blob")
    other = digest_of(b"other")
    blobs = fs_root / "blobs"
    (blobs / "README").write_bytes(b"loose file at the top")
    (blobs / other).write_bytes(b"digest name, but no fan-out directory")
    plant(fs_root, other, fanout="00" if other[:2] != "00" else "11")  # not its fan-out
    plant(fs_root, other, fanout="xy")  # not a hex fan-out at all
    plant(fs_root, other, fanout=other[:3])  # fan-out name too long
    plant(fs_root, other.upper())  # digests are lower case
    plant(fs_root, other[:63])  # too short
    plant(fs_root, other + "0")  # too long
    plant(fs_root, f"{other}.tmp")
    plant(fs_root, f".{other}")
    (blobs / other[:2] / "not-a-digest").mkdir()
    (blobs / digest[:2] / f"{digest}.partial").write_bytes(b"x")
    (blobs / other[:2] / other).mkdir()  # a directory, not a file
    (blobs / "ab").write_bytes(b"a file where a fan-out directory belongs")
    dangling = digest_of(b"dangling")
    (blobs / dangling[:2]).mkdir(exist_ok=True)
    (blobs / dangling[:2] / dangling).symlink_to(fs_root / "nowhere")

    assert listed(fs_store) == {digest: len(b"the only blob")}


def test_fs_blobs_lists_files_placed_in_the_tree(fs_store: FsBlobStore, fs_root: Path) -> None:
    # An operator restoring a backup copies files in: they are blobs like any other.
    digest = digest_of(b"restored")
    path = plant(fs_root, digest, b"restored")
    os.utime(path, (1_000_000_000, 1_000_000_000))

    assert list(fs_store.blobs()) == [BlobInfo(digest, len(b"restored"), 1_000_000_000.0)]


def test_fs_blobs_skips_files_and_fan_outs_vanishing_mid_listing(
    fs_store: FsBlobStore, fs_root: Path
) -> None:
    # Two blobs in each of three fan-outs. Small directories are read whole at the
    # first step, so what is removed after it is still in the listing's hands: it must
    # skip what it can no longer stat or open rather than fail.
    for fanout in ("00", "11", "22"):
        for last in "01":
            plant(fs_root, fanout + last * 62)

    listing = fs_store.blobs()
    first = next(listing)
    blobs = fs_root / "blobs"
    for fanout in ("00", "11", "22"):
        if fanout != first.digest[:2]:
            shutil.rmtree(blobs / fanout)
    for path in (blobs / first.digest[:2]).iterdir():
        if path.name != first.digest:
            path.unlink()

    assert list(listing) == []
    assert first.digest[:2] in ("00", "11", "22")


def test_fs_blobs_without_a_blobs_directory_is_store_error(
    fs_store: FsBlobStore, fs_root: Path
) -> None:
    put(fs_store, b"x")
    shutil.rmtree(fs_root / "blobs")

    with pytest.raises(StoreError):
        list(fs_store.blobs())

    (fs_root / "blobs").write_bytes(b"not a directory")
    with pytest.raises(StoreError):
        list(fs_store.blobs())


def test_fs_blobs_os_error_midway_is_store_error(
    fs_store: FsBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(fs_store, b"x")
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str]) -> object:
        if Path(path).name != "blobs":  # the blobs root lists; a fan-out fails
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)

    with pytest.raises(StoreError) as raised:
        list(fs_store.blobs())
    assert not isinstance(raised.value, StoreFull)
    assert "Input/output error" in str(raised.value)


# --- memory ---------------------------------------------------------------------------


def test_memory_blobs_time_is_the_commit_and_survives_corrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryBlobStore()
    try:
        monkeypatch.setattr(time, "time", lambda: 1_000.0)
        digest = put(store, b"original")
        monkeypatch.setattr(time, "time", lambda: 2_000.0)
        later = put(store, b"later")
        store.corrupt(digest, b"rotten bytes")
        monkeypatch.undo()

        assert sorted(store.blobs(), key=lambda info: info.modified) == [
            BlobInfo(digest, len(b"rotten bytes"), 1_000.0),
            BlobInfo(later, len(b"later"), 2_000.0),
        ]
    finally:
        store.close()


# --- S3 -------------------------------------------------------------------------------


def s3_keys(bucket_url: str) -> list[str]:
    bucket = bucket_url.removeprefix("s3://").partition("/")[0]
    client = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
    try:
        listing = client.list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))
    finally:
        client.close()


def test_s3_layout_and_quarantine(s3_bucket: str) -> None:
    store = open_blob_store(s3_bucket)
    try:
        digest = put(store, b"neff")
        assert s3_keys(s3_bucket) == [f"prefix/blobs/{digest[:2]}/{digest}"]

        store.quarantine(digest)

        [key] = s3_keys(s3_bucket)
        assert key.startswith(f"prefix/quarantine/{digest}.")
    finally:
        store.close()


def test_s3_close_removes_staging(s3_bucket: str) -> None:
    store = open_blob_store(s3_bucket)
    staging = store.staging_dir()
    (staging / "upload-abandoned").write_bytes(b"x")

    store.close()

    assert not staging.exists()


def raw_client() -> Any:
    return boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])


def test_s3_blobs_lists_past_one_page(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 110 keys, 100 a page (S3's own pages hold 1000: the store asks for fewer here,
    # so that the listing must follow a second page). Written straight to the bucket
    # (the listing reads keys, not bytes), in parallel to stay quick.
    from neffcache.server.blobs.s3 import S3BlobStore

    monkeypatch.setattr(S3BlobStore, "list_page_size", 100)
    bucket = s3_bucket.removeprefix("s3://").partition("/")[0]
    datas = [i.to_bytes(2, "big") for i in range(110)]
    digests = [digest_of(data) for data in datas]
    client = raw_client()
    started = time.time()
    try:
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda item: client.put_object(
                        Bucket=bucket, Key=f"prefix/blobs/{item[0][:2]}/{item[0]}", Body=item[1]
                    ),
                    zip(digests, datas, strict=True),
                )
            )
    finally:
        client.close()
    finished = time.time()
    store = open_blob_store(s3_bucket)
    try:
        infos = list(store.blobs())
    finally:
        store.close()

    assert len(infos) == 110
    assert {info.digest: info.size for info in infos} == dict.fromkeys(digests, 2)
    assert all(started - _CLOCK_SLACK <= info.modified <= finished + _CLOCK_SLACK for info in infos)


def test_s3_blobs_lists_only_blob_keys_under_the_prefix(s3_bucket: str) -> None:
    bucket = s3_bucket.removeprefix("s3://").partition("/")[0]
    store = open_blob_store(s3_bucket)
    try:
        digest = put(store, b"the only blob")
        other = digest_of(b"other")
        strays = [
            f"other/blobs/{other[:2]}/{other}",  # another store's prefix
            f"blobs/{other[:2]}/{other}",  # no prefix
            f"prefix/blobs/{other}",  # no fan-out
            f"prefix/blobs/zz/{other}",  # the wrong fan-out
            f"prefix/blobs/{other[:2]}/{other.upper()}",
            f"prefix/blobs/{other[:2]}/{other}.tmp",
            f"prefix/blobs/{other[:2]}/{other}/",
            f"prefix/blobs/{other[:2]}/x/{other}",
            f"prefix/blobs/{other[:2]}//{other}",
            f"prefix/quarantine/{other}",
            f"prefix/{other[:2]}/{other}",
        ]
        client = raw_client()
        try:
            for key in strays:
                client.put_object(Bucket=bucket, Key=key, Body=b"stray")
        finally:
            client.close()

        assert listed(store) == {digest: len(b"the only blob")}
    finally:
        store.close()


def test_s3_blobs_failure_is_store_error(s3_bucket: str) -> None:
    store = open_blob_store(f"s3://neffcache-missing-{uuid.uuid4().hex[:20]}/prefix")
    try:
        with pytest.raises(StoreError, match="NoSuchBucket"):
            list(store.blobs())
    finally:
        store.close()


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_s3_unreachable_endpoint_is_store_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch, unused_port: int, variable: str
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv(variable, f"http://127.0.0.1:{unused_port}")
    store = open_blob_store("s3://neffcache-unreachable/prefix")
    digest = digest_of(b"x")
    try:
        for call in (lambda: store.size(digest), store.check):
            started = time.monotonic()
            with pytest.raises(StoreError) as raised:
                call()
            # Generous: only a hang (botocore's default 60 s timeouts) should fail this.
            assert time.monotonic() - started < 30
            cause = raised.value.__cause__
            assert isinstance(cause, EndpointConnectionError)
            assert f":{unused_port}" in str(cause.kwargs["endpoint_url"])
    finally:
        store.close()


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///prefix", "s3://bucket/prefix?region=x", "s3://AKIAX:hunter2@bucket/p"]
)
def test_s3_url_validation_never_echoes_the_url(url: str) -> None:
    with pytest.raises(ConfigError, match="s3://bucket/prefix") as raised:
        open_blob_store(url)
    assert "hunter2" not in str(raised.value)


# --- registry -------------------------------------------------------------------------


def test_unknown_scheme_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        open_blob_store("ftp://x")

    message = str(raised.value)
    assert "'ftp'" in message
    assert all(scheme in message for scheme in ("file://", "s3://", "memory://"))
