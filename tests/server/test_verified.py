"""Verification on read (verified.py): a blob is hashed on its first read and whenever
its file may have changed; in between, reads stream it unhashed. Corruption written
through the filesystem changes the file's stamp and is caught on the next read."""

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
from neffcache.server.blobs import open_blob_store
from neffcache.server.blobs.fs import FsBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.services import blobs as blob_reads
from neffcache.server.settings import ServerSettings
from neffcache.server.verified import VerifiedMemo

BIG = 17 * 2**20  # streamed, hashed as it goes (over VERIFY_FIRST)
SMALL = 4096  # hashed whole before the answer


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


class Hashes:
    """Counts the blobs the server hashes on read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        verified_response, held_back = blob_reads._verified, blob_reads._held_back

        def counted_verified(*args: object, **kwargs: object) -> object:
            self.count += 1
            return verified_response(*args, **kwargs)  # type: ignore[arg-type]

        def counted_held_back(*args: object, **kwargs: object) -> object:
            self.count += 1
            return held_back(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(blob_reads, "_verified", counted_verified)
        monkeypatch.setattr(blob_reads, "_held_back", counted_held_back)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FsBlobStore]:
    opened = open_blob_store((tmp_path / "blobs").as_uri())
    assert isinstance(opened, FsBlobStore)
    yield opened
    opened.close()


def client(store: FsBlobStore, tmp_path: Path, **settings: float) -> TestClient:
    values = {"max_blob_bytes": 1 << 30, **settings}
    app = create_app(
        ServerSettings(data_dir=tmp_path, **values), blob_store=store, index=MemoryIndex()
    )
    return TestClient(app)


@pytest.fixture
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # A file is remembered only once it is 2 s old; tests cannot wait for every blob.
    monkeypatch.setattr(verified, "_RACY", 0.0)


@pytest.mark.parametrize("size", [SMALL, BIG])
@pytest.mark.usefixtures("no_racy_window")
def test_an_unchanged_verified_blob_is_served_without_hashing(
    size: int, store: FsBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(size)
    hashes = Hashes(monkeypatch)
    with client(store, tmp_path) as http:
        assert http.put(f"/v1/blobs/{digest(data)}", content=data).status_code == 201
        url = f"/v1/blobs/{digest(data)}"
        assert http.get(url).content == data
        assert hashes.count == 1
        assert http.get(url).content == data
        part = http.get(url, headers={"Range": "bytes=100-199"})
        assert part.status_code == 206
        assert part.content == data[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{size}"
        assert hashes.count == 1


@pytest.mark.parametrize("size", [SMALL, BIG])
@pytest.mark.parametrize("change", ["flip", "truncate", "same-size garbage", "replace"])
@pytest.mark.usefixtures("no_racy_window")
def test_a_file_changed_after_verification_is_hashed_again_and_never_served(
    size: int, change: str, store: FsBlobStore, tmp_path: Path
) -> None:
    data = os.urandom(size)
    key = digest(data)
    with client(store, tmp_path) as http:
        http.put(f"/v1/blobs/{key}", content=data)
        assert http.get(f"/v1/blobs/{key}").content == data  # verified, remembered
        path = store.local_path(key)
        assert path is not None
        os.chmod(path, 0o644)
        if change == "flip":
            with open(path, "r+b") as f:
                f.seek(size // 2)
                byte = f.read(1)
                f.seek(size // 2)
                f.write(bytes([byte[0] ^ 1]))
        elif change == "truncate":
            os.truncate(path, size - 1)
        elif change == "same-size garbage":
            path.write_bytes(os.urandom(size))
        else:
            other = path.with_name("other")
            other.write_bytes(os.urandom(size))
            os.replace(other, path)
        if size <= blob_reads.VERIFY_FIRST:
            assert http.get(f"/v1/blobs/{key}").status_code == 404  # hashed first
        else:
            # Streamed: its last chunk is held back and the stream breaks off instead.
            with pytest.raises(Exception, match=key):
                http.get(f"/v1/blobs/{key}")
        assert store.size(key) is None  # quarantined
        assert http.put(f"/v1/blobs/{key}", content=data).status_code == 201  # healed
        assert http.get(f"/v1/blobs/{key}").content == data


@pytest.mark.usefixtures("no_racy_window")
def test_reverify_seconds_zero_hashes_every_read(
    store: FsBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(SMALL)
    hashes = Hashes(monkeypatch)
    with client(store, tmp_path, reverify_seconds=0) as http:
        http.put(f"/v1/blobs/{digest(data)}", content=data)
        for _ in range(3):
            assert http.get(f"/v1/blobs/{digest(data)}").content == data
    assert hashes.count == 3


def test_a_freshly_changed_file_is_not_remembered() -> None:
    memo = VerifiedMemo(3600)
    now = time.time()
    memo.remember("a" * 64, ("stamp",), now, now)  # changed the instant it was seen: racy
    assert not memo.trusted("a" * 64, ("stamp",))
    memo.remember("a" * 64, ("stamp",), now - 10, now)
    assert memo.trusted("a" * 64, ("stamp",))
    assert not memo.trusted("a" * 64, ("another stamp",))
    assert not memo.trusted("a" * 64, ("stamp",))  # a mismatch forgets it


def test_the_memo_expires_and_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = VerifiedMemo(60, entries=3)
    old = time.time() - 10
    for i in range(5):
        memo.remember(f"{i:064x}", ("s", i), old, time.time())
    assert [memo.trusted(f"{i:064x}", ("s", i)) for i in range(5)] == [False, False] + [True] * 3
    later = time.monotonic() + 61
    monkeypatch.setattr(verified.time, "monotonic", lambda: later)
    assert not memo.trusted(f"{4:064x}", ("s", 4))


def test_stores_that_cannot_tell_a_change_are_always_hashed() -> None:
    from neffcache.server.blobs.memory import MemoryBlobStore

    blobs = MemoryBlobStore()
    assert blobs.stamp("a" * 64) is None
    assert not VerifiedMemo(3600).trusted("a" * 64, None)
    blobs.close()


@pytest.mark.parametrize("size", [SMALL, BIG])
@pytest.mark.usefixtures("no_racy_window")
def test_a_write_after_the_stat_is_served_unhashed(
    size: int, store: FsBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that lands between the stamp's check and the read (or during a trusted
    stream) is caught by the check after the read: never served."""
    data = os.urandom(size)
    key = digest(data)
    with client(store, tmp_path) as http:
        assert http.put(f"/v1/blobs/{key}", content=data).status_code == 201
        assert http.get(f"/v1/blobs/{key}").content == data  # verified, remembered
        path = store.local_path(key)
        assert path is not None
        real_read = store.read

        def read_after_a_write(d: str, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def]
            with open(path, "r+b") as f:  # another process writes through the fs
                f.write(b"\0" * 16)
            return real_read(d, start, end)

        monkeypatch.setattr(store, "read", read_after_a_write)
        if size > blob_reads.VERIFY_FIRST:
            # Streamed: its last chunk is held back and the stream breaks off.
            with pytest.raises(Exception, match=key):
                http.get(f"/v1/blobs/{key}")
        else:
            assert http.get(f"/v1/blobs/{key}").status_code == 404  # hashed, found corrupt


def test_the_racy_window_is_measured_from_the_stamp_not_from_the_end_of_hashing(
    store: FsBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The racy window runs from the file's change to when its stamp was taken, not to
    when hashing ended: a long stream must not make a fresh stamp trusted."""
    data = os.urandom(BIG)
    key = digest(data)
    with client(store, tmp_path) as http:
        http.put(f"/v1/blobs/{key}", content=data)  # just committed: ctime is now
        stamped = store.stamp(key)
        assert stamped is not None
        real_read = store.read

        def slow_read(d: str, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def]
            chunks = real_read(d, start, end)
            assert chunks is not None

            def gen() -> Iterator[bytes]:
                for i, chunk in enumerate(chunks):
                    if i == 1:  # the stream has now run for 3 s
                        later = time.time() + 3
                        monkeypatch.setattr(verified.time, "time", lambda at=later: at)
                    yield chunk

            return gen()

        monkeypatch.setattr(store, "read", slow_read)
        assert http.get(f"/v1/blobs/{key}").content == data
        memo = http.app.state.backends.verified  # type: ignore[attr-defined]
        # The stamp was taken within the racy window of the file's change: not trustable.
        assert not memo.trusted(key, stamped[0])
