"""``neffcache prewarm``: every graph of a previous run into L1 before a job starts.

End-to-end tests drive the real command (``python -m neffcache.client.cli prewarm``)
against a real ``neffcache serve``, with run manifests written by real runs of the
wrapper and of the hook (support/e2e.py); the bad-input and progress-bar tests call
the command in this process.

Readings of the brief these tests commit to:

* After prewarm, the same run with the server unreachable is all L1 hits (run
  manifest ``source`` ``l1``) and compiles nothing: no server request at all.
* ``--json`` prints exactly one JSON object on stdout: ``lines`` (non-blank),
  ``malformed``, ``graphs``, ``in_l1``, ``fetched``, ``missing``, ``failed``,
  ``bytes`` (downloaded, each distinct blob once) and ``seconds``; stderr gets one
  summary line, and no progress bar when it is not a terminal.
* Lines that share a key, direct key or address are one graph.
* An entry found by address but compiled under another environment is ``missing``
  (the hook would not serve it either).
* A prewarm that fails leaves no blob, manifest or stock entry in L1.
* A graph the server knows from another trace of the same program is put into L1
  under this run's own keys and stock addresses too; keys are never linked through an
  address alone (it does not cover the environment).
* A graph named by stock address alone (the hook's lines) goes into its stock entry
  only, not into the blob store.
* Prewarm neither writes nor obeys the host's "server down" mark; a failed graph is
  tried once more, and after 5 graphs in a row failed the rest count as failed.
* Ctrl-C ends it with exit 130 within seconds and no ``.fetch-*`` file left; such
  files more than an hour old (a killed download's) are removed when it starts.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.client_units import no_server_down
from support.e2e import (
    BLOCK_A,
    NEFFCACHE,
    STANDIN_VERSION,
    VARIANT,
    CorruptingProxy,
    Done,
    Sandbox,
    Server,
    SilentServer,
    blake3_hex,
    cache_url,
    canonical_key,
    read_run_manifest,
    reference_neff,
    stock_address,
    wait_for,
)

from neffcache.client import prewarm as prewarm_module
from neffcache.client.cli import main
from neffcache.client.local import LocalStore
from neffcache.client.prewarm import GIVE_UP, Progress
from neffcache.client.prewarm import read_run_manifest as read_graphs
from neffcache.client.proxy import entry_lock_name
from neffcache.protocol import inline

SUMMARY_FIELDS = {
    "lines",
    "malformed",
    "graphs",
    "in_l1",
    "fetched",
    "missing",
    "failed",
    "bytes",
    "seconds",
    "interrupted",
}


def prewarm(sandbox: Sandbox, env: dict[str, str], manifest: Path, *args: str) -> Done:
    argv = [*NEFFCACHE, "prewarm", "--manifest", str(manifest), "--json", *args]
    return sandbox.run(argv, env, timeout=60)


def summary(done: Done) -> dict[str, Any]:
    """The --json summary, checked: one JSON line on stdout, one summary line on
    stderr as its last line, no progress bar in a file."""
    assert not done.timed_out, done.describe()
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.describe()
    result: dict[str, Any] = json.loads(lines[0])
    assert set(result) == SUMMARY_FIELDS
    assert result["interrupted"] is False
    assert result["graphs"] == sum(result[s] for s in ("in_l1", "fetched", "missing", "failed"))
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"neffcache prewarm: {result['graphs']} graphs"), done.describe()
    assert "\r" not in done.stderr
    return result


def counts(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("seconds", "interrupted")}


def distinct_bytes(*entries: dict[str, Any] | None) -> int:
    sizes = {}
    for entry in entries:
        assert entry is not None
        sizes.update({ref["digest"]: ref["size"] for ref in entry["files"].values()})
    return sum(sizes.values())


def stored_files(l1: Path) -> list[str]:
    """Everything prewarm may leave in L1 but locks and the server-down mark."""
    return sorted(
        str(p.relative_to(l1))
        for p in l1.rglob("*")
        if p.is_file() and not {"locks", "down"} & set(p.relative_to(l1).parts)
    )


def write_lines(path: Path, *lines: Any) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def fake_key(n: int) -> str:
    return blake3_hex(f"no such graph {n}".encode())


FAKE_ADDRESS = f"neuronxcc-{STANDIN_VERSION}/MODULE_1+00000000"


# --- a real run, prewarmed, runs again from L1 alone -----------------------------------


@pytest.mark.e2e
def test_wrapper_run_prewarmed_runs_again_from_l1_alone(
    server: Server, sandbox: Sandbox, unused_port: int
) -> None:
    url = server.cache_url(sandbox.namespace)
    names = [BLOCK_A, VARIANT]
    first = sandbox.root / "run-1.jsonl"
    l1 = sandbox.new_dir("l1")
    for name in names:
        env = sandbox.env(l1=l1, url=url, extra={"NEFFCACHE_RUN_MANIFEST": str(first)})
        sandbox.wrap(env, name, sandbox.new_dir("out") / "model.neff").check()
    assert sandbox.compiles() == 2

    fresh = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=fresh, url=url), first)
    assert done.returncode == 0, done.describe()
    entries = [server.entry(sandbox.namespace, canonical_key(name)) for name in names]
    assert counts(summary(done)) == {
        "lines": 2,
        "malformed": 0,
        "graphs": 2,
        "in_l1": 0,
        "fetched": 2,
        "missing": 0,
        "failed": 0,
        "bytes": distinct_bytes(*entries),
    }

    # The same run with no server at all: every graph from L1, nothing compiled.
    offline = cache_url(unused_port, sandbox.namespace)
    second = sandbox.root / "run-2.jsonl"
    for name in names:
        env = sandbox.env(l1=fresh, url=offline, extra={"NEFFCACHE_RUN_MANIFEST": str(second)})
        out = sandbox.new_dir("out") / "model.neff"
        sandbox.wrap(env, name, out).check()
        assert out.read_bytes() == reference_neff(name)
    assert sandbox.compiles() == 2
    records = read_run_manifest(second)
    assert [(r["result"], r["source"]) for r in records] == [("hit", "l1")] * 2
    assert all(r["events"].get("server_errors", 0) == 0 for r in records)

    # Prewarming again finds everything in L1 and needs no server either.
    again = prewarm(sandbox, sandbox.env(l1=fresh, url=offline), first)
    assert again.returncode == 0, again.describe()
    result = summary(again)
    assert (result["in_l1"], result["fetched"], result["bytes"]) == (2, 0, 0)


@pytest.mark.e2e
def test_hook_run_prewarmed_runs_again_from_l1_alone(
    server: Server, sandbox: Sandbox, unused_port: int
) -> None:
    url = server.cache_url(sandbox.namespace)
    names = [BLOCK_A, VARIANT]
    first = sandbox.root / "run-1.jsonl"
    extra = {"NEFFCACHE_RUN_MANIFEST": str(first)}
    env = sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True, extra=extra)
    run = sandbox.train(env, names)
    run.done.check()
    assert sandbox.compiles() == 2
    # The hook's lines name a graph by its stock address alone.
    assert [r["key"] for r in read_run_manifest(first)] == [None, None]

    # Compiled under another environment: the hook would not serve it, nor does prewarm.
    other = sandbox.new_dir("l1")
    env = sandbox.env(l1=other, url=url, extra={"XLA_FLAGS": "--xla_cpu_fast_math"})
    done = prewarm(sandbox, env, first)
    assert done.returncode == 0, done.describe()
    assert summary(done)["missing"] == 2
    assert stored_files(other) == []

    fresh = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=fresh, url=url), first, "--parallel", "1")
    assert done.returncode == 0, done.describe()
    result = summary(done)
    assert (result["graphs"], result["fetched"]) == (2, 2)
    for name, neff in zip(names, run.neffs, strict=True):
        entry = fresh / stock_address(name)
        assert (entry / "model.neff").read_bytes() == neff
        assert (entry / "model.done").read_bytes() == b""
    # Straight into the stock entries: the NEFFs are not kept in the blob store too.
    assert [f for f in stored_files(fresh) if f.startswith(".neffcache/blobs/")] == []
    # Each entry's files once, a file two entries share (the flags) twice.
    entries = [server.alias(sandbox.namespace, stock_address(name)) for name in names]
    assert result["bytes"] == sum(distinct_bytes(entry) for entry in entries)

    second = sandbox.root / "run-2.jsonl"
    offline = cache_url(unused_port, sandbox.namespace)
    extra = {"NEFFCACHE_RUN_MANIFEST": str(second)}
    env = sandbox.env(l1=fresh, url=offline, hook=True, extra=extra)
    again = sandbox.train(env, names)
    again.done.check()
    assert sandbox.compiles() == 2
    assert again.neffs == run.neffs
    records = read_run_manifest(second)
    assert [(r["result"], r["source"]) for r in records] == [("hit", "l1")] * 2


# --- misses, trouble, malformed input ---------------------------------------------------


@pytest.mark.e2e
def test_graphs_missing_on_the_server_are_not_an_error(server: Server, sandbox: Sandbox) -> None:
    manifest = write_lines(
        sandbox.root / "run.jsonl",
        {"via": "wrapper", "key": fake_key(1), "direct_key": fake_key(2), "neuron_address": None},
        {"via": "wrapper", "key": None, "direct_key": fake_key(3), "neuron_address": None},
        {"via": "hook", "key": None, "direct_key": None, "neuron_address": FAKE_ADDRESS},
    )
    l1 = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    assert counts(summary(done)) == {
        "lines": 3,
        "malformed": 0,
        "graphs": 3,
        "in_l1": 0,
        "fetched": 0,
        "missing": 3,
        "failed": 0,
        "bytes": 0,
    }
    assert stored_files(l1) == []


@pytest.mark.e2e
def test_bytes_that_do_not_match_fail_and_leave_nothing(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run.jsonl"
    env = sandbox.env(
        l1=sandbox.new_dir("l1"), url=url, extra={"NEFFCACHE_RUN_MANIFEST": str(manifest)}
    )
    sandbox.wrap(env, BLOCK_A, sandbox.new_dir("out") / "model.neff").check()

    l1 = sandbox.new_dir("l1")
    proxy = CorruptingProxy(server.url)
    try:
        env = sandbox.env(l1=l1, url=cache_url(proxy.port, sandbox.namespace))
        done = prewarm(sandbox, env, manifest)
    finally:
        proxy.close()
    assert done.returncode == 1, done.describe()
    assert proxy.corrupted >= 1
    assert summary(done)["failed"] == 1
    assert stored_files(l1) == []

    # Nothing left behind stands in the way of the next, clean, prewarm.
    done = prewarm(sandbox, sandbox.env(l1=l1, url=url), manifest)
    assert done.returncode == 0, done.describe()
    assert summary(done)["fetched"] == 1


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_unreachable_server_is_one_line_and_leaves_nothing(
    sandbox: Sandbox, silent_server: SilentServer, unused_port: int, kind: str
) -> None:
    port = unused_port if kind == "refused" else silent_server.port
    manifest = write_lines(sandbox.root / "run.jsonl", *({"key": fake_key(n)} for n in range(5)))
    l1 = sandbox.new_dir("l1")
    extra = {"NEFFCACHE_CONNECT_TIMEOUT": "0.5", "NEFFCACHE_TIMEOUT": "0.5"}
    env = sandbox.env(l1=l1, url=cache_url(port, sandbox.namespace), extra=extra)
    done = prewarm(sandbox, env, manifest)
    assert done.returncode == 1, done.describe()
    # Given up on at the first graph, not tried for each of the five.
    assert silent_server.accepted <= 1, done.describe()
    assert done.stdout == "", done.describe()
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"neffcache prewarm: cannot reach http://127.0.0.1:{port}"), line
    assert stored_files(l1) == []


@pytest.mark.e2e
def test_malformed_lines_are_counted_and_shared_ids_make_one_graph(
    server: Server, sandbox: Sandbox
) -> None:
    key, direct = fake_key(1), fake_key(2)
    manifest = write_lines(
        sandbox.root / "run.jsonl",
        "",
        "not json",
        "[1, 2]",
        {"via": "hook"},
        {"key": 5},
        {"key": "abc"},
        {"neuron_address": "../../etc"},
        {"key": None, "direct_key": None, "neuron_address": None},  # unkeyed: no graph
        {"key": key, "direct_key": direct},
        "   ",
        {"direct_key": direct, "neuron_address": FAKE_ADDRESS},
        {"key": key},
    )
    with manifest.open("ab") as f:
        f.write(b'{"key": "\xff\xfe"}\n')
    l1 = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    result = summary(done)
    assert (result["lines"], result["malformed"], result["graphs"]) == (11, 7, 1)
    assert result["missing"] == 1


def test_read_run_manifest_groups_and_orders_ids(tmp_path: Path) -> None:
    a, b = (
        f"neuronxcc-{STANDIN_VERSION}/MODULE_1+00000000",
        f"neuronxcc-{STANDIN_VERSION}/MODULE_2+00000000",
    )
    manifest = write_lines(
        tmp_path / "run.jsonl",
        {"neuron_address": a},
        {"key": fake_key(1), "direct_key": fake_key(2), "neuron_address": a},
        {"neuron_address": b},
        {"direct_key": fake_key(2)},
    )
    run = read_graphs(manifest)
    assert [graph.ids for graph in run.graphs] == [
        (("key", fake_key(1)), ("direct_key", fake_key(2)), ("neuron_address", a)),
        (("neuron_address", b),),
    ]


# --- prewarm beside a starting job -------------------------------------------------------


def publish(
    server: Server, namespace: str, address: str | None = None, **fields: Any
) -> dict[str, Any]:
    """An entry with a NEFF under ``address`` (and ``fields``: a key, a direct key),
    published by hand."""
    neff = os.urandom(4096)
    digest = blake3_hex(neff)
    put = httpx.put(f"{server.url}/v1/blobs/{digest}", content=neff, timeout=10, trust_env=False)
    assert put.status_code in (200, 201), put.text
    manifest = {
        "key": blake3_hex(neff + b"key"),
        "neuron_address": address,
        "components": {"env": {}},
        "files": {"model.neff": {"digest": digest, "size": len(neff)}},
        **fields,
    }
    if address is None:
        del manifest["neuron_address"]
    put = httpx.put(
        f"{server.url}/v1/ns/{namespace}/entries/{manifest['key']}",
        json=manifest,
        timeout=10,
        trust_env=False,
    )
    assert put.status_code in (200, 201), put.text
    return manifest


@pytest.mark.e2e
def test_the_stock_entry_is_written_under_the_hooks_lock(server: Server, sandbox: Sandbox) -> None:
    address = f"neuronxcc-{STANDIN_VERSION}/MODULE_77+0acef03a"
    published = publish(server, sandbox.namespace, address)
    manifest = write_lines(sandbox.root / "run.jsonl", {"neuron_address": address})
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace))
    argv = [*NEFFCACHE, "prewarm", "--manifest", str(manifest), "--json"]
    entry = l1 / address
    by_key = l1 / ".neffcache" / "keys" / published["key"][:2] / f"{published['key']}.json"
    with LocalStore(l1).lock(entry_lock_name(address), "the test's rank"):
        running = sandbox.start(argv, env)
        # The manifest is recorded by key just before the stock entry is written.
        wait_for(by_key.exists, 30, "prewarm to record the manifest")
        time.sleep(0.3)
        assert running.poll() is None, "prewarm did not wait for the entry lock"
        assert not entry.exists()
        # Meanwhile a rank of the job writes the entry itself.
        entry.mkdir(parents=True)
        (entry / "model.neff").write_bytes(b"the rank's")
        (entry / "model.done").write_bytes(b"")
    done = running.wait(30)
    assert done.returncode == 0, done.describe()
    assert (summary(done)["fetched"], summary(done)["bytes"]) == (1, 0)
    assert (entry / "model.neff").read_bytes() == b"the rank's"


# --- another trace of the same program ---------------------------------------------------

TRACE_A = f"neuronxcc-{STANDIN_VERSION}/MODULE_111+0123abcd"  # this run's trace
TRACE_B = f"neuronxcc-{STANDIN_VERSION}/MODULE_222+0123abcd"  # the one that published


def same_entry(found: dict[str, Any] | None, published: dict[str, Any]) -> bool:
    """``found`` is the server's copy of ``published`` (which adds its own fields)."""
    return found is not None and all(found.get(k) == v for k, v in published.items())


@pytest.mark.e2e
def test_a_graph_found_under_another_trace_is_prewarmed_for_this_runs_keys(
    server: Server, sandbox: Sandbox
) -> None:
    # The run named the graph by key K, its own direct key D_A and its own address A;
    # the server's entry for K was published by another trace (D_B, B). The next run
    # computes D_A (wrapper) and probes A (hook) again: both must be in L1.
    key, direct_a, direct_b = fake_key(1), fake_key(2), fake_key(3)
    published = publish(server, sandbox.namespace, TRACE_B, key=key, direct_key=direct_b)
    manifest = write_lines(
        sandbox.root / "run.jsonl",
        {"via": "wrapper", "key": key, "direct_key": direct_a, "neuron_address": TRACE_A},
    )
    l1 = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    assert (summary(done)["fetched"], summary(done)["bytes"]) == (1, distinct_bytes(published))
    local = LocalStore(l1)
    for name in (key, direct_a, direct_b):
        assert same_entry(local.manifest(name), published), name
    neff = local.blob_path(published["files"]["model.neff"]["digest"]).read_bytes()
    for address in (TRACE_A, TRACE_B):
        assert (l1 / address / "model.done").is_file(), address
        assert (l1 / address / "model.neff").read_bytes() == neff


@pytest.mark.e2e
def test_keys_that_share_only_an_address_are_not_linked(server: Server, sandbox: Sandbox) -> None:
    # Two compiles of one HLO under other XLA_FLAGS share the stock address but not
    # the key: the entry of one must never be recorded under the other's key.
    mine, other = fake_key(1), fake_key(2)
    published = publish(server, sandbox.namespace, TRACE_A, key=mine)
    manifest = write_lines(
        sandbox.root / "run.jsonl",
        {"key": mine, "neuron_address": TRACE_A},
        {"key": other, "neuron_address": TRACE_A},
    )
    l1 = sandbox.new_dir("l1")
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    assert summary(done)["graphs"] == 1
    assert same_entry(LocalStore(l1).manifest(mine), published)
    assert LocalStore(l1).manifest(other) is None
    assert (l1 / TRACE_A / "model.done").is_file()


# --- server trouble and interruption -------------------------------------------------------


class _FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FaultServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # prewarm sends nothing but GETs
        faults = self.server.faults
        if "/entries/" in self.path:
            faults.entry_lookups += 1
            if faults.entry_lookups <= faults.fail_entries:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        dropped = {"host", inline.HEADER.lower()} if faults.stall_blobs else {"host"}
        # Stalling blobs, the lookups do not ask for the NEFF inline (as from a server
        # that does not inline): it comes as a download, the one that stalls.
        headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
        upstream = faults.upstream.get(self.path, headers=headers)
        data = upstream.content
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("content-type", "text/plain"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if faults.stall_blobs and self.path.startswith("/v1/blobs/"):
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            faults.released.wait(30)  # the rest never comes
            self.close_connection = True
            return
        self.wfile.write(data)


class _FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    faults: FaultyProxy


class FaultyProxy:
    """A proxy to a real server that answers 503 to the first ``fail_entries`` entry
    lookups and, with ``stall_blobs``, sends half of each blob and then nothing."""

    def __init__(self, upstream: str, *, fail_entries: int = 0, stall_blobs: bool = False):
        self.upstream = httpx.Client(base_url=upstream, timeout=30, trust_env=False)
        self.fail_entries = fail_entries
        self.stall_blobs = stall_blobs
        self.entry_lookups = 0
        self.released = threading.Event()
        self._server = _FaultServer(("127.0.0.1", 0), _FaultHandler)
        self._server.faults = self
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.upstream.close()


def publish_keys(server: Server, namespace: str, n: int) -> list[str]:
    return [publish(server, namespace, key=fake_key(i))["key"] for i in range(n)]


def down_mark(l1: Path, server: Server) -> Path:
    """Where a client marks ``server`` down for the host (Remote._mark_path)."""
    return l1 / ".neffcache" / "down" / blake3_hex(server.url.encode())[:16]


@pytest.mark.e2e
def test_one_server_hiccup_fails_no_graph_and_marks_nothing_down(
    server: Server, sandbox: Sandbox
) -> None:
    keys = publish_keys(server, sandbox.namespace, 4)
    manifest = write_lines(sandbox.root / "run.jsonl", *({"key": k} for k in keys))
    l1 = sandbox.new_dir("l1")
    proxy = FaultyProxy(server.url, fail_entries=1)
    try:
        env = sandbox.env(l1=l1, url=cache_url(proxy.port, sandbox.namespace))
        done = prewarm(sandbox, env, manifest, "--parallel", "1")
    finally:
        proxy.close()
    assert done.returncode == 0, done.describe()
    assert proxy.entry_lookups == 5  # the 503, its graph's second try, three more
    result = summary(done)
    assert (result["fetched"], result["failed"]) == (4, 0)
    # The job that follows is not told to skip the server because of it.
    assert not (l1 / ".neffcache" / "down").exists()


@pytest.mark.e2e
def test_a_down_mark_left_by_a_job_does_not_stop_prewarm(server: Server, sandbox: Sandbox) -> None:
    keys = publish_keys(server, sandbox.namespace, 1)
    manifest = write_lines(sandbox.root / "run.jsonl", {"key": keys[0]})
    l1 = sandbox.new_dir("l1")
    mark = down_mark(l1, server)
    mark.parent.mkdir(parents=True)
    mark.write_text(repr(time.time() + 600))
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    assert summary(done)["fetched"] == 1


@pytest.mark.e2e
def test_prewarm_gives_up_after_graphs_fail_in_a_row(
    server: Server,
    namespace: str,
    no_neffcache_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    no_server_down(monkeypatch)
    monkeypatch.setattr(prewarm_module, "RETRY_PAUSE", 0.01)
    keys = publish_keys(server, namespace, 4 * GIVE_UP)
    manifest = write_lines(no_neffcache_env, *({"key": k} for k in keys))
    proxy = FaultyProxy(server.url, fail_entries=10**6)
    try:
        monkeypatch.setenv("NEFFCACHE_URL", cache_url(proxy.port, namespace))
        code = main(["prewarm", "--manifest", str(manifest), "--parallel", "1", "--json"])
    finally:
        proxy.close()
    assert code == 1
    out, _ = capsys.readouterr()
    assert json.loads(out)["failed"] == 4 * GIVE_UP
    assert "prewarm gives up" in caplog.text
    # Each graph before it gave up was tried twice; the one under way may be too.
    assert 2 * GIVE_UP <= proxy.entry_lookups <= 2 * GIVE_UP + 2


@pytest.fixture
def sigint_inherited_as_default() -> Iterator[None]:
    """Children inherit SIGINT as the default action, as from an interactive shell. A
    test run started in the background by a non-interactive shell (``cmd &``) has
    SIGINT ignored, which exec keeps: its children would ignore Ctrl-C, as they should
    then, and this test would see a hang that is not the client's."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.e2e
@pytest.mark.usefixtures("sigint_inherited_as_default")
def test_ctrl_c_exits_130_at_once_and_leaves_no_partial_file(
    server: Server, sandbox: Sandbox
) -> None:
    # One graph the wrapper used (into the blob store), one the hook did (straight
    # into its stock entry): both downloads hang half way when Ctrl-C comes.
    keyed = publish(server, sandbox.namespace, key=fake_key(1))
    publish(server, sandbox.namespace, TRACE_A)
    manifest = write_lines(
        sandbox.root / "run.jsonl", {"key": keyed["key"]}, {"neuron_address": TRACE_A}
    )
    l1 = sandbox.new_dir("l1")
    proxy = FaultyProxy(server.url, stall_blobs=True)
    try:
        extra = {"NEFFCACHE_TIMEOUT": "60"}  # the stall must not end by itself
        env = sandbox.env(l1=l1, url=cache_url(proxy.port, sandbox.namespace), extra=extra)
        running = sandbox.start([*NEFFCACHE, "prewarm", "--manifest", str(manifest)], env)
        wait_for(lambda: len(list(l1.rglob(".fetch-*"))) == 2, 30, "both downloads to begin")
        os.kill(running.pid, signal.SIGINT)
        done = running.wait(30)
    finally:
        proxy.close()
    assert done.returncode == 130, done.describe()
    assert "neffcache prewarm: interrupted" in done.stderr
    # Cut at once, not waited out: a download left to STOP_WAIT would still be stalled
    # when the process exits, its temporary file left behind.
    assert list(l1.rglob(".fetch-*")) == []
    assert not LocalStore(l1).blob_path(keyed["files"]["model.neff"]["digest"]).exists()
    assert not (l1 / TRACE_A / "model.done").exists()


@pytest.mark.e2e
def test_old_temporary_files_are_removed_when_prewarm_starts(
    server: Server, sandbox: Sandbox
) -> None:
    l1 = sandbox.new_dir("l1")
    blobs = l1 / ".neffcache" / "blobs" / "ab"
    entry = l1 / TRACE_A
    old = [blobs / ".fetch-1.aaaa", entry / ".fetch-2.bbbb"]
    new = [blobs / ".fetch-3.cccc", entry / ".fetch-4.dddd"]
    for path in old + new:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    for path in old:
        os.utime(path, (two_hours_ago, two_hours_ago))
    manifest = write_lines(sandbox.root / "run.jsonl", {"key": fake_key(1)})
    done = prewarm(sandbox, sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace)), manifest)
    assert done.returncode == 0, done.describe()
    assert [p.exists() for p in old + new] == [False, False, True, True]


# --- bad input: one line, exit 2 ---------------------------------------------------------


@pytest.fixture
def no_neffcache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith(("NEFFCACHE_", "NEURON_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(tmp_path / "l1"))
    return write_lines(tmp_path / "run.jsonl", {"key": fake_key(1)})


URL = "neffcache+http://127.0.0.1:9/ns"


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({}, [], "set NEFFCACHE_URL"),
        ({"NEFFCACHE_URL": "/a/directory"}, [], "use http://HOST:PORT"),
        ({"NEFFCACHE_URL": "neffcache+ftp://h/ns"}, [], "neffcache+http://HOST:PORT/NAMESPACE"),
        ({"NEURON_COMPILE_CACHE_URL": URL, "NEFFCACHE_DISABLE": "1"}, [], "NEFFCACHE_DISABLE"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "0"], "--parallel '0'"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "65"], "--parallel '65'"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "many"], "--parallel 'many'"),
        ({"NEFFCACHE_URL": URL}, ["--", "extra"], "unexpected arguments: extra"),
        ({}, ["--server", "neffcache+http://h:1/Bad Name"], "NAMESPACE"),
    ],
    ids=[
        "no-url",
        "not-neffcache",
        "bad-url",
        "disabled",
        "parallel-0",
        "parallel-65",
        "parallel-word",
        "extra",
        "bad-url-option",
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    no_neffcache_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    args: list[str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["prewarm", "--manifest", str(no_neffcache_env), *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("neffcache prewarm: error: ")
    assert message in err


@pytest.mark.parametrize(
    "case", ["absent", "directory", "all-malformed", "no-option", "l1-file", "l1-read-only"]
)
def test_bad_input_files_are_one_line_and_exit_2(
    no_neffcache_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    case: str,
) -> None:
    monkeypatch.setenv("NEFFCACHE_URL", URL)
    args = ["--manifest", str(no_neffcache_env)]
    if case == "absent":
        args = ["--manifest", str(tmp_path / "nothing.jsonl")]
    elif case == "directory":
        args = ["--manifest", str(tmp_path)]
    elif case == "all-malformed":
        args = ["--manifest", str(write_lines(tmp_path / "junk.txt", "a", "b", "[]"))]
    elif case == "no-option":
        args = []
    elif case == "l1-read-only":  # a baked image's L1: prewarm would fill it
        monkeypatch.setenv("NEFFCACHE_LOCAL_READ_ONLY", "1")
        args += ["--local-dir", str(tmp_path / "baked")]
    else:
        (tmp_path / "a-file").write_text("")
        args += ["--local-dir", str(tmp_path / "a-file")]
    assert main(["prewarm", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("neffcache prewarm: error: ")
    assert "Traceback" not in err
    if case == "l1-read-only":
        assert "declared read-only (NEFFCACHE_LOCAL_READ_ONLY)" in err
        assert not (tmp_path / "baked").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("parallel", ["1", "64"])
def test_parallel_bounds_are_accepted(
    server: Server,
    no_neffcache_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    namespace: str,
    parallel: str,
) -> None:
    no_server_down(monkeypatch)
    monkeypatch.setenv("NEFFCACHE_URL", server.cache_url(namespace))
    manifest = write_lines(no_neffcache_env, *({"key": fake_key(n)} for n in range(3)))
    assert main(["prewarm", "--manifest", str(manifest), "--parallel", parallel, "--json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out)["missing"] == 3


# --- the progress bar ---------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only() -> None:
    terminal, log_file = Terminal(), io.StringIO()
    for stream in (terminal, log_file):
        bar = Progress(stream, 4, time.monotonic() - 2)
        bar.show(2, 3 * 2**20)
        bar.close()
    assert log_file.getvalue() == ""
    drawn = terminal.getvalue()
    assert "[############............] 2/4 graphs, 3.0 MiB, 2." in drawn
    assert drawn.endswith("\r")  # the line is cleared for the summary
