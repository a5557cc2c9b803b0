"""Review of ``neffcache prewarm``: after it, the next job must find every graph of
the run in L1 without asking the server; it must not give up on the whole run after
one server hiccup; and it must leave no partial files."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from review_bridge.conftest import Server, digest, publish

from neffcache.client.cli import main
from neffcache.client.local import LocalStore

V = "2.20.9961.0+0acef03a"
ADDRESS_A = f"neuronxcc-{V}/MODULE_111+0123abcd"  # this run's trace
ADDRESS_B = f"neuronxcc-{V}/MODULE_222+0123abcd"  # the trace that published the entry


def hexkey(text: str) -> str:
    return digest(text.encode())


def run_manifest(path: Path, *lines: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def prewarm(manifest: Path, url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["prewarm", "--manifest", str(manifest), "--url", url, "--json", *extra])
    return code, json.loads(out.getvalue())


def test_a_graph_found_under_another_trace_is_prewarmed_for_this_runs_keys(
    tmp_path: Path, server: Server, namespace: str, client_env: Path
) -> None:
    # The previous run named the graph by key K, its own direct key D_A and its own
    # address A; the server's entry for K was published by another trace (D_B, B).
    # The next run computes D_A (wrapper) and probes A (hook) again: both must be in
    # L1, or each graph costs server round trips (and the hook, when the HLO is not
    # yet in L1, a lease wait or a compile).
    key, direct_a, direct_b = hexkey("K"), hexkey("D_A"), hexkey("D_B")
    neff = os.urandom(2048)
    publish(
        server.url,
        namespace,
        {"key": key, "direct_key": direct_b, "neuron_address": ADDRESS_B, "components": {"env": {}}},
        {"model.neff": neff},
    )
    manifest = run_manifest(
        tmp_path / "run.jsonl",
        {"via": "wrapper", "key": key, "direct_key": direct_a, "neuron_address": ADDRESS_A},
    )
    code, summary = prewarm(manifest, f"neffcache+{server.url}/{namespace}")
    assert code == 0
    assert summary["fetched"] == 1
    l1 = client_env
    assert LocalStore(l1).manifest(direct_a) is not None, "the run's direct key misses L1"
    assert (l1 / ADDRESS_A / "model.done").is_file(), "the run's stock address misses L1"


def fail_first_entry_lookup(app: Any) -> Any:
    failed = False

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        nonlocal failed
        if scope["type"] == "http" and scope["method"] == "GET" and "/entries/" in scope["path"]:
            if not failed:
                failed = True
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return wrapped


def test_one_server_hiccup_does_not_fail_every_other_graph(
    tmp_path: Path, wrapped_server: Any, client_env: Path
) -> None:
    url = wrapped_server(fail_first_entry_lookup)
    keys = [hexkey(f"graph {n}") for n in range(4)]
    for key in keys:
        publish(url, "team-a", {"key": key, "components": {"env": {}}}, {"model.neff": os.urandom(512)})
    manifest = run_manifest(tmp_path / "run.jsonl", *({"key": k} for k in keys))
    code, summary = prewarm(manifest, f"neffcache+{url}/team-a", "--parallel", "1")
    assert (summary["failed"], summary["fetched"]) == (1, 3), (
        f"one 503 turned into {summary['failed']} failed graphs: {summary}"
    )
    # And the next job on this host is not told to skip the server because of it.
    assert not list((client_env / ".neffcache" / "down").glob("*"))


class _Stop:
    flag = False


def stall_blob_downloads(app: Any) -> Any:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"].startswith("/v1/blobs/"):
            headers = [(b"content-length", str(1 << 20).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"x" * 4096, "more_body": True})
            deadline = time.monotonic() + 20
            while not _Stop.flag and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return
        await app(scope, receive, send)

    return wrapped


def test_an_interrupted_prewarm_leaves_no_partial_file(
    tmp_path: Path, wrapped_server: Any, client_env: Path
) -> None:
    # docs/client.md and _prewarm_cmd.py: "Every file is written under a temporary
    # name: nothing half written is left". The download threads are daemons: Ctrl-C
    # ends the process without their ``finally``, and the temporary file stays.
    url = wrapped_server(stall_blob_downloads)
    _Stop.flag = False
    key = hexkey("big graph")
    publish(url, "team-a", {"key": key, "components": {"env": {}}}, {"model.neff": os.urandom(1 << 20)})
    manifest = run_manifest(tmp_path / "run.jsonl", {"key": key})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEFFCACHE_", "NEURON_"))}
    env.update(NEFFCACHE_LOCAL_DIR=str(client_env), NO_PROXY="127.0.0.1", NEFFCACHE_TIMEOUT="60")
    argv = [sys.executable, "-m", "neffcache.client.cli", "prewarm", "--manifest", str(manifest)]
    child = subprocess.Popen([*argv, "--url", f"neffcache+{url}/team-a"], env=env)
    try:
        deadline = time.monotonic() + 30
        while not list(client_env.rglob(".fetch-*")):
            assert child.poll() is None and time.monotonic() < deadline, "no download began"
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 130
    finally:
        _Stop.flag = True
        if child.poll() is None:
            child.kill()
    left = [str(p.relative_to(client_env)) for p in client_env.rglob(".fetch-*")]
    assert left == [], f"partial downloads left in L1: {left}"
