"""Unit tests for ``neffcache.client.proxy.Core``, the server logic behind the cache the
hook hands to libneuronxla, over a minimal stand-in for the SDK's filesystem cache and
a scripted in-test HTTP server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from loopback import free_port
from support.client_units import ADDRESS, VERSION, FakeStock, delta, digest
from support.http_stubs import Answer, Route, ScriptedServer, scripted

from neffcache.client import remote as remote_module
from neffcache.client.config import ClientConfig
from neffcache.client.keys import context, direct_key
from neffcache.client.proxy import Core, _publisher, make_proxy_class
from neffcache.client.stats import STATS

HLO_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"


def asked(server: ScriptedServer) -> list[str]:
    """The paths the server was asked for, percent-decoding undone."""
    return [unquote(path) for path in server.paths]


def publishing_route(entries: list[bytes]) -> Route:
    """A server that takes every upload (all blobs missing) and keeps each entry's
    manifest in ``entries``."""

    def route(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if path == "/v1/blobs/missing":
            return 200, json.dumps({"missing": json.loads(body)["digests"]}).encode()
        if method == "PUT" and "/entries/" in path:
            entries.append(body)
        return 201, b"{}"

    return route


_CORES: list[Core] = []


@pytest.fixture(autouse=True)
def _fresh_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No server is down at the start; every Core's connection is closed at the end."""
    monkeypatch.setattr(remote_module, "_down_until", {})
    yield
    while _CORES:
        _CORES.pop().remote.close()


def make_core(
    tmp_path: Path, server: str | None = None, **extra: str
) -> tuple[Core, FakeStock, Path]:
    root = tmp_path / "l1"
    root.mkdir(exist_ok=True)
    env = {
        "NEFFCACHE_URL": f"neffcache+{server or f'http://127.0.0.1:{free_port()}'}/team-a",
        "NEFFCACHE_LOCAL_DIR": str(root),
        "NEFFCACHE_CONNECT_TIMEOUT": "0.5",
        "NEFFCACHE_TIMEOUT": "2",
        "NEFFCACHE_RUN_MANIFEST": str(tmp_path / "run.jsonl"),
        **extra,
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    stock = FakeStock(root)
    core = Core(stock, config)
    _CORES.append(core)
    entry = root / ADDRESS
    entry.mkdir(parents=True)
    return core, stock, entry


def run_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "run.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# --- model.log ------------------------------------------------------------------------


def test_a_cached_failure_is_never_replayed(tmp_path: Path) -> None:
    core, _, entry = make_core(tmp_path)
    (entry / "model.log").write_text("ERROR")
    assert core.exists(str(entry / "model.log")) is False
    assert core.remote.available()  # decided without the server


@pytest.mark.parametrize("value", ["1", "true"])
def test_stock_failures_replays_it(tmp_path: Path, value: str) -> None:
    core, _, entry = make_core(tmp_path, NEFFCACHE_STOCK_FAILURES=value)
    assert core.exists(str(entry / "model.log")) is False  # none there
    (entry / "model.log").write_text("ERROR")
    assert core.exists(str(entry / "model.log")) is True


# --- model.done -----------------------------------------------------------------------


def test_done_in_l1_is_a_hit_without_the_server(tmp_path: Path) -> None:
    with scripted(lambda m, p: (500, b"")) as server:
        core, _, entry = make_core(tmp_path, server.url)
        (entry / "model.done").write_text("")
        (entry / "model.neff").write_bytes(b"x" * 10)
        assert core.exists(str(entry / "model.done"))
        assert server.requests == []
    (line,) = run_lines(tmp_path)
    assert (line["result"], line["source"], line["neuron_address"]) == ("hit", "l1", ADDRESS)
    assert line["bytes"] == 10


def test_other_files_are_not_looked_up(tmp_path: Path) -> None:
    with scripted(lambda m, p: (404, b"{}")) as server:
        core, _, entry = make_core(tmp_path, server.url)
        assert not core.exists(str(entry / "compile_flags.json"))
        assert not core.exists(str(entry / "model.hlo_module.pb"))
        # Not an entry of this cache's layout: nothing to ask for.
        assert not core.exists(str(tmp_path / "elsewhere" / "model.done"))
        assert not core.exists(str(entry.parent / "model.done"))
        assert server.requests == []


def test_done_with_the_server_refusing_is_false_and_quick(tmp_path: Path) -> None:
    # Timeouts of a minute: waiting one out would take that long, a refusal a
    # millisecond (the bound below is only far from both).
    slow = {"NEFFCACHE_CONNECT_TIMEOUT": "60", "NEFFCACHE_TIMEOUT": "60"}
    core, stock, entry = make_core(tmp_path, **slow)
    start = time.monotonic()
    assert core.exists(str(entry / "model.done")) is False
    assert time.monotonic() - start < 30
    assert not core.remote.available()
    before = STATS.snapshot()
    assert core.exists(str(entry / "model.done")) is False
    assert delta(before, "server_errors") == 0  # not asked again: it would refuse again
    assert stock.uploads == []
    assert not (entry / "model.done").exists()


def test_done_with_the_server_down_does_not_ask_again(tmp_path: Path) -> None:
    with scripted(lambda m, p: (503, b"")) as server:
        core, _, entry = make_core(tmp_path, server.url)
        assert core.exists(str(entry / "model.done")) is False
        assert len(server.requests) == 1
        before = STATS.snapshot()
        assert core.exists(str(entry / "model.done")) is False
        assert core.exists(str(entry / "model.neff")) is False
        assert len(server.requests) == 1
        # Each probe skipped while the server is down is counted, as the shim's are.
        assert delta(before, "server_skipped") == 2


def test_done_with_a_silent_server_ends_within_the_timeout(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        core, _, entry = make_core(tmp_path, url, NEFFCACHE_TIMEOUT="0.5")
        start = time.monotonic()
        assert core.exists(str(entry / "model.done")) is False
        # Only far from the 0.5 s it takes: a wait for the never-coming answer hangs.
        assert time.monotonic() - start < 30
    finally:
        listener.close()


def _entry_answer(
    files: dict[str, bytes], *, alias: str = ADDRESS, serve: dict[str, bytes] | None = None
) -> Answer:
    """A server with one entry of ``files`` under the alias ``alias``, its blobs (and
    ``serve``'s bytes for their digests) under /v1/blobs/."""
    manifest = {
        "key": "c" * 64,
        "direct_key": "d" * 64,
        "neuron_address": ADDRESS,
        "files": {
            name: {"digest": digest(data), "size": len(data)} for name, data in files.items()
        },
    }
    blobs = {digest(data): data for data in files.values()}
    blobs.update(serve or {})

    def answer(method: str, path: str) -> tuple[int, bytes]:
        path = unquote(path)
        if path == f"/v1/ns/team-a/aliases/{alias}":
            return 200, json.dumps(manifest).encode()
        if path.startswith("/v1/blobs/") and path[len("/v1/blobs/") :] in blobs:
            return 200, blobs[path[len("/v1/blobs/") :]]
        return 404, b'{"detail": "absent"}'

    return answer


def test_a_server_hit_is_written_into_l1_done_last(tmp_path: Path) -> None:
    neff = os.urandom(20_000)
    theirs = b"the publisher's HLO"
    files = {"model.neff": neff, "model.hlo_module.pb": theirs, "wrapped_neff.hlo": b"w" * 99}
    answer = _entry_answer(files)
    before = STATS.snapshot()
    with scripted(answer) as server:
        core, stock, entry = make_core(tmp_path, server.url)
        ours = b"the SDK's own HLO"
        (entry / "model.hlo_module.pb").write_bytes(ours)
        assert core.exists(str(entry / "model.done")) is True
    assert (entry / "model.neff").read_bytes() == neff
    assert (entry / "wrapped_neff.hlo").read_bytes() == b"w" * 99
    assert (entry / "model.hlo_module.pb").read_bytes() == ours  # the SDK's file is kept
    # model.done came through the SDK's own writer, after every artifact was in place.
    assert stock.uploads == [
        ("model.done", ["model.hlo_module.pb", "model.neff", "wrapped_neff.hlo"])
    ]
    assert (entry / "model.done").stat().st_mtime_ns >= (entry / "model.neff").stat().st_mtime_ns
    assert not core.local.blob_path(digest(neff)).exists()  # one copy on disk: the entry's
    assert delta(before, "hits_server") == 1
    (line,) = run_lines(tmp_path)
    assert (line["result"], line["source"]) == ("hit", "server")
    assert line["key"] == "c" * 64
    assert line["bytes"] == len(neff)


def test_a_blob_with_other_bytes_is_not_a_hit(tmp_path: Path) -> None:
    neff = os.urandom(5000)
    answer = _entry_answer({"model.neff": neff}, serve={digest(neff): os.urandom(5000)})
    with scripted(answer) as server:
        core, stock, entry = make_core(tmp_path, server.url)
        assert core.exists(str(entry / "model.done")) is False
    assert stock.uploads == []
    assert sorted(os.listdir(entry)) == []
    assert not core.local.has_blob(digest(neff), len(neff))


def test_a_manifest_without_a_neff_is_not_a_hit(tmp_path: Path) -> None:
    answer = _entry_answer({"model.hlo_module.pb": b"hlo"})
    with scripted(answer) as server:
        core, stock, entry = make_core(tmp_path, server.url)
        assert core.exists(str(entry / "model.done")) is False
    assert stock.uploads == []


def test_the_direct_key_is_asked_when_the_address_misses(tmp_path: Path) -> None:
    module = HLO_FIXTURE.read_bytes()
    flags = ["--target=trn1", "--model-type=transformer"]
    direct = direct_key(module, context(VERSION, "trn1", flags, os.environ)).key
    neff = os.urandom(3000)
    answer = _entry_answer({"model.neff": neff}, alias=direct)
    with scripted(answer) as server:
        core, _, entry = make_core(tmp_path, server.url)
        (entry / "model.hlo_module.pb").write_bytes(module)
        (entry / "compile_flags.json").write_text(json.dumps(flags))
        assert core.exists(str(entry / "model.done")) is True
    assert [path for path in asked(server) if "/v1/ns/" in path] == [
        f"/v1/ns/team-a/aliases/{ADDRESS}",
        f"/v1/ns/team-a/aliases/{direct}",
    ]
    assert (entry / "model.neff").read_bytes() == neff


# --- publishing -----------------------------------------------------------------------


def test_done_uploaded_by_the_sdk_is_published(tmp_path: Path) -> None:
    entries: list[bytes] = []
    module = HLO_FIXTURE.read_bytes()
    with scripted(route=publishing_route(entries)) as server:
        core, _, entry = make_core(tmp_path, server.url)
        (entry / "model.hlo_module.pb").write_bytes(module)
        core.uploaded(str(entry / "model.hlo_module.pb"))
        (entry / "compile_flags.json").write_text('["--target=trn1"]')
        (entry / "model.neff").write_bytes(b"NEFF" * 50)
        (entry / "model.hlo_module.pb.lock").write_text("")
        (entry / "model.done").write_text("")
        core.uploaded(str(entry / "model.done"))
        assert _publisher(core.config).flush(timeout=10)
    assert len(entries) == 1
    manifest = json.loads(entries[0])
    assert manifest["neuron_address"] == ADDRESS
    assert set(manifest["files"]) == {"model.neff", "model.hlo_module.pb", "compile_flags.json"}
    assert manifest["files"]["model.neff"]["digest"] == digest(b"NEFF" * 50)
    assert isinstance(manifest["compile_seconds"], float)
    (line,) = run_lines(tmp_path)
    assert (line["result"], line["source"]) == ("miss", "compiler")


# --- the SDK's per-entry compile lock -------------------------------------------------


def _flock_name(hlo: Path) -> str:
    return "hlo-" + digest(str(hlo).encode())[:32]


def test_entry_lock_is_marked_and_released(tmp_path: Path) -> None:
    core, _, entry = make_core(tmp_path)
    hlo = entry / "model.hlo_module.pb"
    core.acquire_entry(str(hlo))
    (entry / "model.hlo_module.pb.lock").write_text("")  # what the SDK's lock creates
    core.mark_entry(str(hlo))
    assert (entry / "model.hlo_module.pb.lock").read_text() == f"neffcache pid {os.getpid()}\n"
    with core.local.lock(_flock_name(hlo), "test", wait=0.1) as held:
        assert held is False  # the flock is held while the SDK's lock is
    core.release_entry(str(hlo))
    with core.local.lock(_flock_name(hlo), "test", wait=0.1) as held:
        assert held is True
    core.release_entry(str(hlo))  # a second release is harmless


def test_a_lock_left_by_a_dead_neffcache_process_is_removed(tmp_path: Path) -> None:
    core, _, entry = make_core(tmp_path)
    hlo = entry / "model.hlo_module.pb"
    (entry / "model.hlo_module.pb.lock").write_text("neffcache pid 999999\n")
    before = STATS.snapshot()
    core.acquire_entry(str(hlo))
    core.release_entry(str(hlo))
    assert not (entry / "model.hlo_module.pb.lock").exists()
    assert delta(before, "stale_locks_removed") == 1


@pytest.mark.parametrize("content", [b"", b"1234\n", b"\xffneffcache pid 1"])
def test_a_lock_made_without_neffcache_is_kept(tmp_path: Path, content: bytes) -> None:
    core, _, entry = make_core(tmp_path)
    hlo = entry / "model.hlo_module.pb"
    (entry / "model.hlo_module.pb.lock").write_bytes(content)
    core.acquire_entry(str(hlo))
    core.release_entry(str(hlo))
    assert (entry / "model.hlo_module.pb.lock").read_bytes() == content


_ENTRY_HOLDER = """
import sys, time
from neffcache.client.config import ClientConfig
from neffcache.client.proxy import Core

class Stock:
    cache_path = sys.argv[1]

config = ClientConfig.from_env({"NEFFCACHE_URL": "neffcache+http://127.0.0.1:1/team-a",
                                "NEFFCACHE_LOCAL_DIR": sys.argv[1]})
core = Core(Stock(), config)
core.acquire_entry(sys.argv[2])
open(sys.argv[2] + ".lock", "w").close()
core.mark_entry(sys.argv[2])
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.e2e
def test_a_killed_compile_frees_its_entry(tmp_path: Path) -> None:
    core, _, entry = make_core(tmp_path)
    hlo = entry / "model.hlo_module.pb"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(repo / d) for d in ("keying", "client")))
    holder = subprocess.Popen(
        [sys.executable, "-c", _ENTRY_HOLDER, core.stock.cache_path, str(hlo)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    waiter = threading.Thread(target=core.acquire_entry, args=(str(hlo),), daemon=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # a live holder is waited for
        assert (entry / "model.hlo_module.pb.lock").exists()
        holder.kill()
        holder.wait(timeout=10)
        waiter.join(30)  # only ends the wait: the dead one's lock is seen at once
        assert not waiter.is_alive()
        assert not (entry / "model.hlo_module.pb.lock").exists()  # the dead one's lock
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)
        assert holder.stdout is not None
        holder.stdout.close()
        core.release_entry(str(hlo))


# --- the class the hook hands to the SDK ----------------------------------------------


class SdkBase:
    """Stands for libneuronxla's CompileCache: methods the proxy must not inherit."""

    def get_hlos(self) -> str:
        return "base"

    def hlo_acquire_lock(self, hlo_path: str) -> None:
        raise AssertionError("the base class must not be reached")


class LockingStock(FakeStock):
    def __init__(self, root: Path, fail: bool = False) -> None:
        super().__init__(root)
        self.cache_url = "url"
        self.fail = fail
        self.calls: list[str] = []

    def get_hlos(self) -> str:
        return "stock"

    def hlo_acquire_lock(self, hlo_path: str, timeout: float | None = None) -> None:
        self.calls.append(f"acquire {timeout}")
        if self.fail:
            raise TimeoutError("still locked")
        Path(hlo_path + ".lock").write_text("")

    def hlo_release_lock(self, hlo_path: str) -> None:
        self.calls.append("release")
        Path(hlo_path + ".lock").unlink()


def make_proxy(tmp_path: Path, fail: bool = False) -> tuple[Any, LockingStock, Path]:
    core, _, entry = make_core(tmp_path)
    stock = LockingStock(Path(core.stock.cache_path), fail)
    proxy = make_proxy_class(SdkBase)(stock, core.config, "neffcache+http://x/team-a")
    _CORES.append(proxy._core)
    return proxy, stock, entry


def test_the_proxy_is_an_sdk_cache_over_l1(tmp_path: Path) -> None:
    proxy, stock, _ = make_proxy(tmp_path)
    assert isinstance(proxy, SdkBase)
    assert getattr(proxy, "cache_path", None) == stock.cache_path
    assert proxy.get_hlos() == "stock"  # delegated, not the base class's


def test_the_proxy_compile_lock_wraps_the_sdks(tmp_path: Path) -> None:
    proxy, stock, entry = make_proxy(tmp_path)
    hlo = entry / "model.hlo_module.pb"
    proxy.hlo_acquire_lock(str(hlo), timeout=5)
    assert stock.calls == ["acquire 5"]
    assert (entry / "model.hlo_module.pb.lock").read_text().startswith("neffcache pid ")
    with proxy._core.local.lock(_flock_name(hlo), "test", wait=0.1) as held:
        assert held is False
    proxy.hlo_release_lock(str(hlo))
    assert stock.calls == ["acquire 5", "release"]
    with proxy._core.local.lock(_flock_name(hlo), "test", wait=0.1) as held:
        assert held is True


def test_a_failed_sdk_lock_releases_the_flock(tmp_path: Path) -> None:
    proxy, _, entry = make_proxy(tmp_path, fail=True)
    hlo = entry / "model.hlo_module.pb"
    with pytest.raises(TimeoutError):
        proxy.hlo_acquire_lock(str(hlo))
    with proxy._core.local.lock(_flock_name(hlo), "test", wait=0.1) as held:
        assert held is True


def test_an_in_place_write_elsewhere_does_not_change_a_served_entry(tmp_path: Path) -> None:
    from neffcache.client.local import copy_atomic

    neff = os.urandom(4096)
    answer = _entry_answer({"model.neff": neff})
    with scripted(answer) as server:
        core, _, entry = make_core(tmp_path, server.url)
        assert core.exists(str(entry / "model.done"))
    # What session.Session._materialize does for a later hit of the same NEFF (the
    # blob in L1 first, as the wrapper keeps it):
    core.local.add_blob(entry / "model.neff", digest(neff))
    output = tmp_path / "workdir" / "model.neff"
    copy_atomic(core.local.blob_path(digest(neff)), output)
    with open(output, "r+b") as f:  # a later compile rewriting its --output in place
        f.write(b"other graph")
    assert (entry / "model.neff").read_bytes() == neff
    assert core.local.blob_path(digest(neff)).read_bytes() == neff


@pytest.mark.parametrize("name", ["model.hlo_module.pb.lock", ".hidden", "model.done", "model.log"])
def test_a_manifest_cannot_plant_a_lock_or_marker_in_an_l1_entry(name: str, tmp_path: Path) -> None:
    """A lock file named in a manifest would make the SDK wait for a compile nobody
    runs; markers are the writer's to set. Only artifacts are written."""
    from neffcache.client.local import LocalStore
    from neffcache.client.proxy import write_entry

    local = LocalStore(tmp_path / "l1")
    payload = tmp_path / "payload"
    payload.write_bytes(b"bytes of a file")
    ref = {"digest": digest(payload.read_bytes()), "size": payload.stat().st_size}
    local.add_blob(payload, ref["digest"])
    entry = tmp_path / "l1" / "neuronxcc-2.20.9961.0+0acef03a" / "MODULE_1+3cc9a3cb"
    entry.mkdir(parents=True)
    manifest = {"files": {"model.neff": ref, name: ref}}
    marked: list[Path] = []
    assert write_entry(local, None, entry, manifest, marked.append)  # type: ignore[arg-type]
    assert (entry / "model.neff").read_bytes() == b"bytes of a file"
    assert not (entry / name).exists()
    assert marked == [entry / "model.done"]


# --- the three eras of the stock layout (docs/neuron-sdk.md#layout-eras) --------------


def _asked_direct_key(tmp_path: Path, flags_file: str, content: str) -> str | None:
    """The direct key the hook asks for when the address misses, for an entry whose
    flags file is ``flags_file`` holding ``content``; None when it asks for none."""
    answer = _entry_answer({"model.neff": b"NEFF"}, alias="0" * 64)
    with scripted(answer) as server:
        core, _, entry = make_core(tmp_path, server.url)
        (entry / "model.hlo_module.pb").write_bytes(HLO_FIXTURE.read_bytes())
        (entry / flags_file).write_text(content)
        assert core.exists(str(entry / "model.done")) is False
    aliases = [path for path in asked(server) if "/aliases/" in path]
    assert aliases[0] == f"/v1/ns/team-a/aliases/{ADDRESS}"
    return aliases[1].rsplit("/", 1)[1] if len(aliases) > 1 else None


def test_an_nxdi_two_word_target_keys_as_the_one_word_form(tmp_path: Path) -> None:
    module = HLO_FIXTURE.read_bytes()
    flags = ["--target=trn2", "--model-type=transformer"]
    expected = direct_key(module, context(VERSION, "trn2", flags, os.environ)).key
    two_words = json.dumps(["--target", "trn2", "--model-type=transformer"])
    assert _asked_direct_key(tmp_path, "compile_flags.json", two_words) == expected


def test_a_raw_era_compile_flags_txt_entry_is_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The oldest era wrote the raw string and no --target (docs/neuron-sdk.md#layout-eras):
    # the platform's target comes from the environment, as for a JSON-era entry.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    module = HLO_FIXTURE.read_bytes()
    flags = ["--model-type", "transformer", "--auto-cast=none"]
    expected = direct_key(module, context(VERSION, "trn1", flags, os.environ)).key
    raw = "--model-type transformer --auto-cast=none"
    assert _asked_direct_key(tmp_path, "compile_flags.txt", raw) == expected


def test_an_entry_without_a_target_anywhere_is_not_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert _asked_direct_key(tmp_path, "compile_flags.json", '["--auto-cast=none"]') is None


@pytest.mark.parametrize(
    ("flags_file", "content", "era"),
    [
        ("compile_flags.txt", "--auto-cast none", "raw"),
        ("compile_flags.json", "[]", "json"),
        ("compile_flags.json", '["--target=trn1", "--model-type=transformer"]', "target"),
        ("compile_flags.json", '["--target", "trn2"]', "target"),
    ],
)
def test_a_published_entry_records_its_era(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags_file: str, content: str, era: str
) -> None:
    entries: list[bytes] = []
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with scripted(route=publishing_route(entries)) as server:
        core, _, entry = make_core(tmp_path, server.url)
        (entry / "model.hlo_module.pb").write_bytes(HLO_FIXTURE.read_bytes())
        (entry / flags_file).write_text(content)
        core.uploaded(str(entry / flags_file))
        (entry / "model.neff").write_bytes(b"NEFF" * 50)
        (entry / "model.done").write_text("")
        core.uploaded(str(entry / "model.done"))
        assert _publisher(core.config).flush(timeout=10)
    manifest = json.loads(entries[0])
    assert manifest["stock_era"] == era
    assert set(manifest["files"]) == {"model.neff", "model.hlo_module.pb", flags_file}


# --- the shim's stock address in each era (wrapper.stock_address_of) ------------------


@pytest.mark.parametrize(
    ("flags8", "user", "target", "era", "flags_file"),
    [
        ("00875417", ["--auto-cast", "none"], "trn1", "raw", b"--auto-cast none"),
        ("d7517139", [], "trn1", "json", b"[]"),
        (
            "d7cde3b5",
            ["--model-type=transformer", "--auto-cast=none"],
            "trn1",
            "json",
            b'["--model-type=transformer", "--auto-cast=none"]',
        ),
        (
            "613edded",
            ["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"],
            "trn1",
            "target",
            b'["--target=trn1", "--model-type=transformer", "--auto-cast=none", '
            b'"--execute-repetition=1"]',
        ),
        (
            "7ac4dbae",
            ["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"],
            "trn2",
            "target",
            b'["--target=trn2", "--model-type=transformer", "--auto-cast=none", '
            b'"--execute-repetition=1"]',
        ),
    ],
)
def test_the_shim_claims_a_stock_address_of_every_era(
    flags8: str, user: list[str], target: str, era: str, flags_file: bytes
) -> None:
    from neffcache.client.compile_call import flags_file as flags_file_of
    from neffcache.client.compile_call import neuron_address_of, stock_address_of
    from neffcache.client.wrapper import parse

    name = f"/w/model.MODULE_1+{flags8}.hlo_module.pb"
    argv = ["compile", "--framework=XLA", name, "--output", "o.neff", "--target", target]
    call = parse([*argv, *user, "--verbose=35"])
    assert call is not None
    found = stock_address_of(call, VERSION)
    assert found is not None
    assert (
        found.address
        == f"neuronxcc-{VERSION}/MODULE_1+{flags8}"
        == neuron_address_of(call, VERSION)
    )
    assert found.era.value == era
    file_name = "compile_flags.txt" if era == "raw" else "compile_flags.json"
    assert flags_file_of(call, found.era) == (file_name, flags_file)
    # Another call's flags on the same file name claim nothing.
    other = parse([*argv, *user, "--optlevel=1"])
    assert other is not None
    assert stock_address_of(other, VERSION) is None


# --- reads that do not go through exists() -----------------------------------------------


class ReadingStock(LockingStock):
    """The SDK's readers of an entry: what they find in L1 when they run."""

    def download_folder(self, folder_path: str, dst_path: str) -> bool:
        if not os.path.exists(os.path.join(folder_path, "model.done")):
            return False
        for name in os.listdir(folder_path):
            Path(dst_path, name).write_bytes(Path(folder_path, name).read_bytes())
        return True

    def download_file(self, path: str, dst_path: str) -> None:
        Path(dst_path).write_bytes(Path(path).read_bytes())

    def download_file_to_string(self, path: str, limit: int | None = None) -> str:
        return Path(path).read_text()

    def download_artifacts(self, parent_dir: str, dst: str) -> None:
        self.download_folder(parent_dir, dst)


@pytest.mark.parametrize(
    "read", ["download_folder", "download_file", "download_artifacts", "exists-folder"]
)
def test_reads_of_a_whole_entry_are_served_from_the_server(tmp_path: Path, read: str) -> None:
    """optimum's Hub proxy and NxD Inference read entries with download_folder,
    download_file and exists() on the folder; transformers-neuronx with
    download_artifacts. With L1 empty, each must find the server's entry."""
    neff = os.urandom(3000)
    answer = _entry_answer({"model.neff": neff})
    with scripted(answer) as server:
        core, _, entry = make_core(tmp_path, server.url)
        stock = ReadingStock(Path(core.stock.cache_path))
        proxy = make_proxy_class(SdkBase)(stock, core.config, "neffcache+http://x/team-a")
        _CORES.append(proxy._core)
        dst = tmp_path / "dst"
        dst.mkdir()
        if read == "download_folder":
            assert proxy.download_folder(str(entry), str(dst)) is True
        elif read == "download_file":
            proxy.download_file(str(entry / "model.neff"), str(dst / "model.neff"))
        elif read == "download_artifacts":
            proxy.download_artifacts(str(entry), str(dst))
        else:  # a fresh host: not even the folder is in L1
            entry.rmdir()
            assert proxy.exists(str(entry)) is True
            stock.download_folder(str(entry), str(dst))
    assert (dst / "model.neff").read_bytes() == neff
    assert (entry / "model.done").exists()


def test_reads_outside_an_entry_ask_nothing(tmp_path: Path) -> None:
    with scripted(lambda m, p: (404, b"{}")) as server:
        core, _, entry = make_core(tmp_path, server.url)
        registry = Path(core.stock.cache_path) / "neuronxcc-2.20.9961.0+0acef03a" / "0_REGISTRY"
        registry.mkdir(parents=True)
        (registry / "x.json").write_text("{}")
        core.before_read(str(registry / "x.json"))
        core.before_read(str(tmp_path / "elsewhere"))
        assert core.exists(str(entry / "model.hlo_module.pb")) is False
    assert server.requests == []
