"""Unit tests for ``neffcache.client.l1limit``: L1's size limit (``NEFFCACHE_LOCAL_MAX_SIZE``).

Time is an injected clock (``NOW``) and every file's time is set explicitly, so nothing
here depends on how fast the machine is. Locks held "by another process" are a child
process's flock, or a second descriptor in this one (flock locks one open file, so a
second descriptor conflicts with the first as another process's would).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.client_units import delta, digest

from neffcache.client.config import ClientConfig, ConfigError
from neffcache.client.l1limit import (
    DEFAULT_MAX_SIZE,
    Evictor,
    Item,
    default_limit,
    entry_lock_name,
    grew,
    try_lock,
)
from neffcache.client.local import LocalStore
from neffcache.client.proxy import Core
from neffcache.client.stats import STATS

URL = "neffcache+http://127.0.0.1:9/team-a"
NOW = 2_000_000_000.0  # the injected clock's "now" (2033), far from any real file time
DAY = 86400.0
VERSION = "2.20.9961.0+0acef03a"


def stamp_of(l1: Path) -> Path:
    return l1 / ".neffcache" / "locks" / "l1-evict.stamp"


def clock() -> float:
    return NOW


def evictor(l1: Path, max_size: int | None, **extra: Any) -> Evictor:
    settings: dict[str, Any] = {"clock": clock, "interval": 0.0, **extra}
    return Evictor(l1, max_size, **settings)


def set_time(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def blob(l1: Path, data: bytes, when: float) -> Path:
    """A blob as L1 keeps it (named by its BLAKE3 digest), last used at ``when``."""
    name = digest(data)
    path = l1 / ".neffcache" / "blobs" / name[:2] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    set_time(path, when)
    return path


def blobs(l1: Path, count: int, size: int = 1000) -> list[Path]:
    """``count`` blobs of ``size`` bytes, oldest first, a day apart."""
    return [blob(l1, bytes([i]) * size, NOW - (count - i) * DAY) for i in range(count)]


def entry(
    l1: Path, module: int, size: int, when: float, *, done: bool = True, extra: tuple[str, ...] = ()
) -> Path:
    """A stock entry (``model.neff`` of ``size`` bytes, its HLO and flags, ``model.done``
    when ``done``, and the files named in ``extra``), every file written at ``when``."""
    path = l1 / f"neuronxcc-{VERSION}" / f"MODULE_{module}+abcdef01"
    path.mkdir(parents=True)
    (path / "model.neff").write_bytes(b"n" * size)
    (path / "model.hlo_module.pb").write_bytes(b"h")
    (path / "compile_flags.json").write_text("[]")
    for name in (("model.done",) if done else ()) + extra:
        (path / name).write_bytes(b"")
    for file in path.iterdir():
        set_time(file, when)
    return path


def entry_size(size: int) -> int:
    return size + 1 + 2  # model.neff, the HLO, the flags


def manifest(l1: Path, key: str, neff: Path, when: float) -> Path:
    path = l1 / ".neffcache" / "keys" / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    size = neff.stat().st_size
    path.write_text(f'{{"files": {{"model.neff": {{"digest": "{neff.name}", "size": {size}}}}}}}')
    set_time(path, when)
    return path


@pytest.fixture
def l1(tmp_path: Path) -> Path:
    path = tmp_path / "l1"
    (path / ".neffcache").mkdir(parents=True)
    return path


# --- least recently used first ----------------------------------------------------------


def test_over_the_limit_the_oldest_go_down_to_the_low_water_mark(l1: Path) -> None:
    made = blobs(l1, 10)
    before = STATS.snapshot()
    removed = evictor(l1, 5000).run()
    # 10 000 bytes against 5000: down to 4500 (LOW_WATER), so six go, oldest first.
    assert removed == made[:6]
    assert [p.exists() for p in made] == [False] * 6 + [True] * 4
    assert delta(before, "l1_evicted") == 6
    assert delta(before, "l1_evicted_bytes") == 6000


def test_under_the_limit_nothing_goes(l1: Path) -> None:
    made = blobs(l1, 5)
    assert evictor(l1, 5000).run() == []
    assert all(p.exists() for p in made)


def test_zero_means_unlimited(l1: Path) -> None:
    made = blobs(l1, 5)
    assert evictor(l1, 0).run() == []
    config = config_for(l1, NEFFCACHE_LOCAL_MAX_SIZE="0")
    assert config.local_max_size == 0
    grew(config)
    assert all(p.exists() for p in made)
    assert not stamp_of(l1).exists()  # not even a walk


def test_stock_entries_and_blobs_share_one_order(l1: Path) -> None:
    old_entry = entry(l1, 1, 997, NOW - 3 * DAY)
    old_blob = blob(l1, b"b" * 1000, NOW - 2 * DAY)
    new_entry = entry(l1, 2, 997, NOW - 1 * DAY)
    assert evictor(l1, 2500).run() == [old_entry]
    assert not old_entry.exists()
    assert old_blob.exists()
    assert new_entry.exists()


# A hit sets a file's time by this machine's clock, so these two tests date their files
# by it too; the injected clock is a day later, so nothing is in its grace period.


def test_a_hit_refreshes_recency(l1: Path) -> None:
    now = time.time()
    older, newer = blob(l1, b"a" * 1000, now - 2 * DAY), blob(l1, b"b" * 1000, now - DAY)
    assert LocalStore(l1).has_blob(older.name, 1000)  # the wrapper's L1 hit
    assert evictor(l1, 1500, clock=lambda: older.stat().st_mtime + DAY).run() == [newer]
    assert older.exists()


def test_a_hook_hit_refreshes_its_entry(l1: Path) -> None:
    now = time.time()
    older, newer = entry(l1, 1, 997, now - 2 * DAY), entry(l1, 2, 997, now - DAY)
    core = Core(FakeStock(l1), config_for(l1))
    try:
        assert core.exists(str(older / "model.done"))  # the SDK's probe: an L1 hit
    finally:
        core.remote.close()
    later = (older / "model.done").stat().st_mtime + DAY
    assert evictor(l1, 1500, clock=lambda: later).run() == [newer]


# --- what is never removed --------------------------------------------------------------


def test_young_files_are_kept(l1: Path) -> None:
    old = blob(l1, b"o" * 1000, NOW - DAY)
    young = [blob(l1, bytes([i]) * 1000, NOW - 60) for i in range(3)]
    young_entry = entry(l1, 1, 997, NOW - 60)
    assert evictor(l1, 1000).run() == [old]
    assert all(p.exists() for p in young)
    assert (young_entry / "model.done").exists()


def test_a_blob_locked_by_another_process_is_kept(l1: Path) -> None:
    made = blobs(l1, 6)
    with flock_held_by_child(l1 / ".neffcache", f"blob-{made[0].name}"):
        removed = evictor(l1, 4000).run()
    assert removed == made[1:4]  # down to 3600 without the oldest, which a download holds
    assert made[0].exists()


def test_a_stock_entry_being_fetched_is_kept(l1: Path) -> None:
    locked, other = entry(l1, 1, 997, NOW - 2 * DAY), entry(l1, 2, 997, NOW - DAY)
    fd = try_lock(l1 / ".neffcache", entry_lock_name(address_of(locked)))  # the hook's lock
    assert fd is not None
    try:
        assert evictor(l1, 1000).run() == [other]
    finally:
        os.close(fd)
    assert (locked / "model.done").exists()


def test_an_entry_with_the_sdks_lock_is_kept(l1: Path) -> None:
    locked = entry(l1, 1, 997, NOW - 2 * DAY, extra=("model.hlo_module.pb.lock",))
    assert evictor(l1, 100).run() == []
    assert (locked / "model.done").exists()
    assert (locked / "model.hlo_module.pb.lock").exists()


def test_an_incomplete_entry_is_kept_until_abandoned(l1: Path) -> None:
    writing = entry(l1, 1, 997, NOW - 3 * 3600, done=False)
    assert evictor(l1, 100).run() == []
    assert (writing / "model.neff").exists()
    abandoned = entry(l1, 2, 997, NOW - 2 * DAY, done=False, extra=("model.log",))
    assert evictor(l1, 100).run() == [abandoned]
    assert writing.exists()
    assert not abandoned.exists()


def test_an_entry_being_written_is_young_by_its_temporary(l1: Path) -> None:
    busy = entry(l1, 1, 997, NOW - 2 * DAY, done=False)
    temp = busy / ".model.neff.123.abcdef"
    temp.write_bytes(b"t")
    set_time(temp, NOW - 30)
    assert evictor(l1, 100, abandoned=3600).run() == []
    assert temp.exists()


def test_a_file_used_after_the_walk_is_put_back(l1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The walk saw it old; a hit touched it before the removal: it stays.
    used_now = blob(l1, b"u" * 1000, NOW - 30)
    stale = Item(NOW - DAY, 1000, used_now, False)
    monkeypatch.setattr(Evictor, "_blobs", lambda self, deadline: iter([stale]))
    assert evictor(l1, 100).run() == []
    assert used_now.read_bytes() == b"u" * 1000
    assert sorted(p.name for p in used_now.parent.iterdir()) == [used_now.name]


@pytest.mark.parametrize("when", ["before the lock", "as model.done is renamed"])
def test_an_entry_hit_after_the_walk_keeps_model_done(
    l1: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    hit = entry(l1, 1, 997, NOW - DAY)
    if when == "before the lock":
        set_time(hit / "model.done", NOW - 30)  # the SDK's probe touched it
    else:
        rename = os.rename

        def touched_first(src: Any, dst: Any) -> None:
            if Path(src).name == "model.done":  # the probe wins the race by a hair
                set_time(Path(src), NOW - 1)
            rename(src, dst)

        monkeypatch.setattr(os, "rename", touched_first)
    stale = Item(NOW - DAY, 1000, hit, True)
    monkeypatch.setattr(Evictor, "_entries", lambda self, deadline: iter([stale]))
    assert evictor(l1, 100).run() == []
    assert sorted(p.name for p in hit.iterdir()) == [
        "compile_flags.json",
        "model.done",
        "model.hlo_module.pb",
        "model.neff",
    ]


# --- how a stock entry goes ---------------------------------------------------------------


def test_a_stock_entry_goes_whole_model_done_first(
    l1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = entry(l1, 1, 997, NOW - DAY)
    renames: list[tuple[str, str]] = []
    rename = os.rename

    def recording(src: Any, dst: Any) -> None:
        renames.append((str(src), str(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", recording)
    assert evictor(l1, 100).run() == [gone]
    # model.done first, then the whole directory out of sight, emptied there.
    assert renames[0] == (str(gone / "model.done"), str(gone / ".evicting-model.done"))
    assert renames[1][0] == str(gone)
    assert Path(renames[1][1]).parent == l1 / ".neffcache" / "evicting"
    assert len(renames) == 2
    assert not gone.exists()
    assert list((l1 / ".neffcache" / "evicting").iterdir()) == []
    assert (l1 / f"neuronxcc-{VERSION}").is_dir()  # the SDK may be making an entry in it


def test_what_a_killed_evictor_left_is_cleared(l1: Path) -> None:
    left = l1 / ".neffcache" / "evicting" / "123.abc"
    left.mkdir(parents=True)
    (left / "model.neff").write_bytes(b"n")
    hidden = blob(l1, b"x", NOW - DAY)
    hidden = hidden.rename(hidden.with_name(".evicting-" + hidden.name))
    blobs(l1, 2)
    evictor(l1, 100).run()
    assert not left.exists()
    assert not hidden.exists()


def test_manifests_whose_blob_is_gone_go_with_it(l1: Path) -> None:
    old, kept = blob(l1, b"o" * 1000, NOW - 2 * DAY), blob(l1, b"k" * 1000, NOW - DAY)
    orphan = manifest(l1, "a" * 64, old, NOW - 2 * DAY)
    young_orphan = manifest(l1, "b" * 64, old, NOW - 30)
    live = manifest(l1, "c" * 64, kept, NOW - 2 * DAY)
    before = STATS.snapshot()
    assert evictor(l1, 1500).run() == [old, orphan]
    assert not orphan.exists()
    assert young_orphan.exists()
    assert live.exists()
    assert delta(before, "l1_evicted_manifests") == 1


# --- when it runs -------------------------------------------------------------------------


def test_a_run_is_due_once_per_interval(l1: Path) -> None:
    made = blobs(l1, 4)
    now = [NOW]
    timed = Evictor(l1, 2000, clock=lambda: now[0], interval=600.0)
    assert timed.due()
    assert timed.run() == made[:3]  # 4000 bytes down to 1800
    big = blob(l1, b"z" * 3000, NOW - 2 * DAY)
    assert not timed.due()
    assert timed.run() == []
    now[0] += 600.0
    assert timed.due()
    assert timed.run() == [big]


def test_no_time_left_removes_nothing(l1: Path) -> None:
    made = blobs(l1, 4)
    assert evictor(l1, 1000, budget=0.0).run() == []
    assert all(p.exists() for p in made)


def test_one_evictor_at_a_time(l1: Path) -> None:
    made = blobs(l1, 4)
    fd = try_lock(l1 / ".neffcache", "l1-evict")
    assert fd is not None
    try:
        assert evictor(l1, 1000).run() == []
    finally:
        os.close(fd)
    assert all(p.exists() for p in made)


def test_many_processes_evicting_at_once(l1: Path) -> None:
    made = blobs(l1, 40)
    locked = made[0]
    context = multiprocessing.get_context("fork")
    results: Any = context.Queue()
    with flock_held_by_child(l1 / ".neffcache", f"blob-{locked.name}"):
        workers = [context.Process(target=_evict_repeatedly, args=(l1, results)) for _ in range(8)]
        for worker in workers:
            worker.start()
        removed = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * 8
    flat = [path for each in removed for path in each]
    assert all(not isinstance(path, str) or not path.startswith("error") for path in flat)
    assert len(flat) == len(set(flat))  # each file removed at most once
    assert str(locked) not in flat
    assert locked.exists()
    # 40 000 bytes against 20 000: down to 18 000, the locked one skipped.
    assert sorted(flat) == sorted(str(p) for p in made[1:23])


def _evict_repeatedly(l1: Path, results: Any) -> None:
    removed: list[str] = []
    try:
        for _ in range(20):
            removed += [str(p) for p in evictor(l1, 20_000).run()]
    except Exception as exc:  # reported to the test, which fails on it
        removed.append(f"error {exc!r}")
    results.put(removed)


def test_grew_applies_the_configured_limit(l1: Path) -> None:
    made = blobs(l1, 4)
    for age, path in enumerate(reversed(made), start=1):  # grew's clock is the real one
        set_time(path, time.time() - age * DAY)
    grew(config_for(l1, NEFFCACHE_LOCAL_MAX_SIZE="2K"))
    assert [p.exists() for p in made] == [False, False, False, True]  # down to 1843 bytes
    assert stamp_of(l1).exists()
    big = blob(l1, b"y" * 5000, time.time() - 9 * DAY)
    grew(config_for(l1, NEFFCACHE_LOCAL_MAX_SIZE="2K"))  # within the interval: no walk
    assert big.exists()
    assert made[3].exists()


def test_grew_in_the_background(l1: Path) -> None:
    made = blobs(l1, 4)
    for age, path in enumerate(reversed(made), start=1):
        set_time(path, time.time() - age * DAY)
    grew(config_for(l1, NEFFCACHE_LOCAL_MAX_SIZE="3000"), background=True)
    for thread in threading.enumerate():
        if thread.name == "neffcache-l1":
            thread.join(timeout=60)
    assert [p.exists() for p in made] == [False, False, True, True]


def test_a_removal_that_fails_is_counted_and_the_run_goes_on(
    l1: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    made = blobs(l1, 4)
    rename = os.rename

    def refused(src: Any, dst: Any) -> None:
        if Path(src) in made[:2]:
            raise PermissionError(13, "Permission denied", str(src))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", refused)
    before = STATS.snapshot()
    assert evictor(l1, 2000).run() == made[2:]
    assert delta(before, "l1_eviction_errors") == 2
    assert len([r for r in caplog.records if "cannot evict" in r.getMessage()]) == 1


def test_grew_never_raises(l1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Evictor) -> list[Path]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Evictor, "run", broken)
    before = STATS.snapshot()
    grew(config_for(l1))
    assert delta(before, "l1_eviction_errors") == 1


# --- the setting ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("50G", 50 << 30),
        ("500M", 500 << 20),
        ("1.5TiB", int(1.5 * (1 << 40))),
        ("2gb", 2 << 30),
        ("100K", 100 << 10),
        ("1048576", 1 << 20),
        ("0", 0),
        ("none", 0),
        ("", None),
    ],
)
def test_sizes_are_spelled_as_the_admin_commands_spell_them(
    value: str, expected: int | None
) -> None:
    assert config_for(Path("/l1"), NEFFCACHE_LOCAL_MAX_SIZE=value).local_max_size == expected


@pytest.mark.parametrize("value", ["lots", "-1G", "5X", "1e9", "G"])
def test_a_bad_size_is_a_config_error_naming_the_fix(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_for(Path("/l1"), NEFFCACHE_LOCAL_MAX_SIZE=value)
    message = str(caught.value)
    assert "NEFFCACHE_LOCAL_MAX_SIZE" in message
    assert repr(value) in message
    assert "50G" in message
    assert "0 for no limit" in message


def test_the_default_is_50_gib_or_a_quarter_of_the_filesystem(l1: Path) -> None:
    fs = os.statvfs(l1)
    assert default_limit(l1) == min(DEFAULT_MAX_SIZE, int(fs.f_blocks * fs.f_frsize * 0.25))
    assert evictor(l1, None).limit() == default_limit(l1)
    assert default_limit(l1 / "absent") == DEFAULT_MAX_SIZE


# --- helpers ----------------------------------------------------------------------------------


class FakeStock:
    def __init__(self, root: Path) -> None:
        self.cache_path = str(root)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)


def config_for(l1: Path, **extra: str) -> ClientConfig:
    env = {"NEFFCACHE_URL": URL, "NEFFCACHE_LOCAL_DIR": str(l1), "NEFFCACHE_TELEMETRY": "0"}
    config = ClientConfig.from_env({**env, **extra})
    assert config is not None
    return config


def address_of(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


class flock_held_by_child:  # noqa: N801 (used as a context manager, like a function)
    """The flock ``root/locks/<name>.flock`` held by a child process while the block runs."""

    def __init__(self, root: Path, name: str) -> None:
        self.path = root / "locks" / f"{name}.flock"

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.child = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(self.path)], stdout=subprocess.PIPE, text=True
        )
        assert self.child.stdout is not None
        assert self.child.stdout.readline().strip() == "held"

    def __exit__(self, *exc: object) -> None:
        self.child.kill()
        self.child.wait(timeout=10)
        assert self.child.stdout is not None
        self.child.stdout.close()
