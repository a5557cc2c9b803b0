"""Unit tests for ``neffcache.client.local``: verified blobs, manifests, atomic writes and
the per-key ``flock`` (held across processes, released by the kernel when its holder
is killed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.client_units import Clock, delta, digest

from neffcache.client.local import LocalStore, atomic_write, copy_atomic, file_digest, release
from neffcache.client.stats import STATS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "l1")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from neffcache.client import local

    return Clock().install(monkeypatch, local)


# --- blobs ----------------------------------------------------------------------------


def test_blob_layout_and_add(store: LocalStore, tmp_path: Path) -> None:
    data = os.urandom(5000)
    src = tmp_path / "neff"
    src.write_bytes(data)
    path = store.add_blob(src, digest(data))
    assert path == tmp_path / "l1" / ".neffcache" / "blobs" / digest(data)[:2] / digest(data)
    assert path.read_bytes() == data
    assert store.has_blob(digest(data), len(data))
    assert file_digest(path) == digest(data)


def test_add_blob_keeps_a_present_copy(store: LocalStore, tmp_path: Path) -> None:
    data = b"neff bytes"
    src = tmp_path / "neff"
    src.write_bytes(data)
    path = store.add_blob(src, digest(data))
    inode = path.stat().st_ino
    store.add_blob(src, digest(data))
    assert path.stat().st_ino == inode


def test_has_blob_of_an_absent_blob(store: LocalStore) -> None:
    before = STATS.snapshot()
    assert not store.has_blob("a" * 64, 10)
    assert delta(before, "bad_local_blobs") == 0


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_has_blob_removes_a_damaged_copy(store: LocalStore, tmp_path: Path, damage: str) -> None:
    data = os.urandom(3000)
    src = tmp_path / "neff"
    src.write_bytes(data)
    path = store.add_blob(src, digest(data))
    damaged = {
        "flip": bytes([data[0] ^ 1]) + data[1:],
        "truncate": data[:-1],
        "extend": data + b"x",
    }
    # A new file in its place: the stored blob may be a hard link to ``src``.
    path.unlink()
    path.write_bytes(damaged[damage])
    before = STATS.snapshot()
    assert not store.has_blob(digest(data), len(data))
    assert not path.exists()
    assert delta(before, "bad_local_blobs") == 1
    # The next add puts the right bytes back.
    store.add_blob(src, digest(data))
    assert store.has_blob(digest(data), len(data))


def test_an_in_place_change_to_the_source_does_not_reach_l1(
    store: LocalStore, tmp_path: Path
) -> None:
    # add_blob copies: a compiler that later rewrites its --output in place must not
    # change the L1 blob (nor an entry the SDK serves from it).
    data = os.urandom(2000)
    src = tmp_path / "out.neff"
    src.write_bytes(data)
    store.add_blob(src, digest(data))
    with open(src, "r+b") as f:
        f.write(b"X")
    assert store.has_blob(digest(data), len(data))
    assert store.blob_path(digest(data)).read_bytes() == data


# --- manifests ------------------------------------------------------------------------


def test_manifest_round_trip(store: LocalStore) -> None:
    key = "ab" + "c" * 62
    manifest = {"key": key, "files": {"model.neff": {"digest": "d" * 64, "size": 3}}, "n": 1.5}
    assert store.manifest(key) is None
    store.put_manifest(key, manifest)
    assert store.manifest(key) == manifest
    path = store.root / "keys" / "ab" / f"{key}.json"
    assert json.loads(path.read_bytes()) == manifest
    other = {"key": key, "files": {"model.neff": {"digest": "e" * 64, "size": 4}}, "v": 2}
    store.put_manifest(key, other)  # replaced whole
    assert store.manifest(key) == other
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_manifest_is_a_miss(store: LocalStore, content: bytes) -> None:
    key = "e" * 64
    path = store.root / "keys" / "ee" / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert store.manifest(key) is None


# --- atomic writes --------------------------------------------------------------------


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(target.parent) == ["f.json"]


def test_copy_atomic_failure_leaves_no_temp(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        copy_atomic(tmp_path / "absent", tmp_path / "out" / "neff")
    assert os.listdir(tmp_path / "out") == []


# --- the lock -------------------------------------------------------------------------

_HOLDER = """
import sys, time
from neffcache.client.local import LocalStore
with LocalStore(sys.argv[1]).lock(sys.argv[2], "test") as held:
    print("held" if held else "not held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding the lock "k" in ``tmp_path/l1`` until killed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("keying", "client"))
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "l1"), "k"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


@pytest.mark.e2e
def test_a_held_lock_is_not_taken_by_another_process(
    holder: subprocess.Popen[str], store: LocalStore, clock: Clock
) -> None:
    before = STATS.snapshot()
    with store.lock("k", "graph k", wait=0.3) as held:
        assert held is False
    assert 0.3 <= clock.now < 0.4  # as long as asked, one poll more at most
    assert delta(before, "lock_wait_timeouts") == 1
    # The holder's pid is in the lock file, for the "held by pid" message.
    assert (store.root / "locks" / "k.flock").read_text().strip() == str(holder.pid)


@pytest.mark.e2e
def test_a_killed_holder_releases_the_lock(
    holder: subprocess.Popen[str], store: LocalStore, clock: Clock
) -> None:
    with store.lock("k", "graph k", wait=0.2) as held:
        assert held is False
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    waited = clock.now
    with store.lock("k", "graph k", wait=1.0) as held:
        assert held is True
    assert clock.now == waited  # taken at the first try: the kernel released it


@pytest.mark.e2e
def test_other_keys_are_not_blocked(holder: subprocess.Popen[str], store: LocalStore) -> None:
    with store.lock("other", "graph other", wait=0.2) as held:
        assert held is True


def test_lock_is_released_when_the_block_ends(store: LocalStore) -> None:
    with store.lock("k", "graph k") as held:
        assert held is True
        # A second descriptor, even in this process, cannot take it meanwhile.
        with store.lock("k", "graph k", wait=0.1) as again:
            assert again is False
    with store.lock("k", "graph k", wait=0.1) as after:
        assert after is True


def test_lock_file_is_not_one_clear_locks_removes(store: LocalStore) -> None:
    with store.lock("k", "graph k"):
        pass
    names = os.listdir(store.root / "locks")
    assert names == ["k.flock"]
    assert not any(name.endswith(".lock") for name in names)


def test_lock_that_cannot_be_created_yields_false(tmp_path: Path, clock: Clock) -> None:
    # Root ignores permissions; a path under a regular file fails for everyone.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    store = LocalStore(blocker / "l1")
    before = STATS.snapshot()
    with store.lock("k", "graph k") as held:
        assert held is False
    assert clock.now == 0.0  # no wait for a lock that cannot exist
    assert delta(before, "local_errors") == 1


def test_lock_yields_false_but_the_block_still_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ran = []
    with LocalStore(blocker).lock("k", "graph k") as held:
        ran.append(held)
    assert ran == [False]


def test_acquire_and_release(store: LocalStore, tmp_path: Path) -> None:
    fd = store.acquire("k", "graph k")
    assert fd is not None
    assert store.acquire("k", "graph k", wait=0.1) is None
    release(fd)
    again = store.acquire("k", "graph k", wait=0.1)
    assert again is not None
    release(again)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert LocalStore(blocker).acquire("k", "graph k") is None
