"""``neffcache prewarm``: every graph of a previous run into L1 before a job starts.

End-to-end tests drive the real command (``python -m neffcache.client.cli prewarm``)
against a real ``neffcache serve``, with run manifests written by real runs of the
wrapper and of the hook (e2e_harness.py); the bad-input and progress-bar tests call
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
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from client.e2e_harness import (
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
from client.unit_support import no_server_down

from neffcache.client.cli import main
from neffcache.client.local import LocalStore
from neffcache.client.prewarm import Progress
from neffcache.client.prewarm import read_run_manifest as read_graphs
from neffcache.client.proxy import entry_lock_name

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
    assert result["graphs"] == sum(result[s] for s in ("in_l1", "fetched", "missing", "failed"))
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"neffcache prewarm: {result['graphs']} graphs"), done.describe()
    assert "\r" not in done.stderr
    return result


def counts(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "seconds"}


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


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_unreachable_server_fails_quickly_and_leaves_nothing(
    sandbox: Sandbox, silent_server: SilentServer, unused_port: int, kind: str
) -> None:
    port = unused_port if kind == "refused" else silent_server.port
    manifest = write_lines(sandbox.root / "run.jsonl", *({"key": fake_key(n)} for n in range(5)))
    l1 = sandbox.new_dir("l1")
    extra = {"NEFFCACHE_CONNECT_TIMEOUT": "0.5", "NEFFCACHE_TIMEOUT": "0.5"}
    env = sandbox.env(l1=l1, url=cache_url(port, sandbox.namespace), extra=extra)
    done = prewarm(sandbox, env, manifest)
    assert done.returncode == 1, done.describe()
    assert done.seconds < 10, done.describe()
    result = summary(done)
    assert (result["graphs"], result["failed"], result["missing"]) == (5, 5, 0)
    assert stored_files(l1) == []


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


def publish(server: Server, namespace: str, address: str) -> dict[str, Any]:
    """An entry with a NEFF under ``address``, published by hand."""
    neff = os.urandom(4096)
    digest = blake3_hex(neff)
    put = httpx.put(f"{server.url}/v1/blobs/{digest}", content=neff, timeout=10, trust_env=False)
    assert put.status_code in (200, 201), put.text
    manifest = {
        "key": blake3_hex(neff + b"key"),
        "neuron_address": address,
        "components": {"env": {}},
        "files": {"model.neff": {"digest": digest, "size": len(neff)}},
    }
    put = httpx.put(
        f"{server.url}/v1/ns/{namespace}/entries/{manifest['key']}",
        json=manifest,
        timeout=10,
        trust_env=False,
    )
    assert put.status_code in (200, 201), put.text
    return manifest


def test_the_stock_entry_is_written_under_the_hooks_lock(server: Server, sandbox: Sandbox) -> None:
    address = f"neuronxcc-{STANDIN_VERSION}/MODULE_77+0acef03a"
    published = publish(server, sandbox.namespace, address)
    digest = published["files"]["model.neff"]["digest"]
    manifest = write_lines(sandbox.root / "run.jsonl", {"neuron_address": address})
    l1 = sandbox.new_dir("l1")
    env = sandbox.env(l1=l1, url=server.cache_url(sandbox.namespace))
    argv = [*NEFFCACHE, "prewarm", "--manifest", str(manifest), "--json"]
    entry = l1 / address
    with LocalStore(l1).lock(entry_lock_name(address), "the test's rank"):
        running = sandbox.start(argv, env)
        blob = LocalStore(l1).blob_path(digest)
        wait_for(blob.exists, 30, "prewarm to fetch the blob")
        time.sleep(0.3)
        assert running.poll() is None, "prewarm did not wait for the entry lock"
        assert not entry.exists()
        # Meanwhile a rank of the job writes the entry itself.
        entry.mkdir(parents=True)
        (entry / "model.neff").write_bytes(b"the rank's")
        (entry / "model.done").write_bytes(b"")
    done = running.wait(30)
    assert done.returncode == 0, done.describe()
    assert summary(done)["fetched"] == 1
    assert (entry / "model.neff").read_bytes() == b"the rank's"
    assert (
        l1 / ".neffcache" / "keys" / published["key"][:2] / f"{published['key']}.json"
    ).is_file()


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
        ({"NEFFCACHE_URL": "/a/directory"}, [], "set NEFFCACHE_URL"),
        ({"NEFFCACHE_URL": "neffcache+ftp://h/ns"}, [], "neffcache+http://HOST:PORT/NAMESPACE"),
        ({"NEURON_COMPILE_CACHE_URL": URL, "NEFFCACHE_DISABLE": "1"}, [], "NEFFCACHE_DISABLE"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "0"], "--parallel '0'"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "65"], "--parallel '65'"),
        ({"NEFFCACHE_URL": URL}, ["--parallel", "many"], "--parallel 'many'"),
        ({"NEFFCACHE_URL": URL}, ["--", "extra"], "unexpected arguments: extra"),
        ({}, ["--url", "neffcache+http://h:1/Bad Name"], "namespace"),
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


@pytest.mark.parametrize("case", ["absent", "directory", "all-malformed", "no-option", "l1-file"])
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
    else:
        (tmp_path / "a-file").write_text("")
        args += ["--local-dir", str(tmp_path / "a-file")]
    assert main(["prewarm", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("neffcache prewarm: error: ")
    assert "Traceback" not in err


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
