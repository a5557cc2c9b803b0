"""End to end: telemetry events and miss reasons through the wrapper and the hook,
against a real ``neffcache serve`` and the stand-ins (see support/e2e.py).

A cold run, then a warm run with a fresh L1, through each interception point: every
run-manifest line carries its facts and, on a miss, the reason the server gave; and
the server stored one graph event per line with the same facts (read back from the
server's own SQLite index, as its reports read them), plus the counters.

Readings these tests commit to:

* A graph the server never saw misses as ``new-graph``; the same program under another
  compiler version as ``compiler-changed`` (reasons come from the server's
  explanation, asked for while the graph compiled).
* A hit's ``saved_seconds`` is the served entry's ``compile_seconds``; an L1 hit of the
  hook on an entry it fetched reports the same.
* With the server down, a miss's reason is ``server-unavailable``; with
  ``NEFFCACHE_TELEMETRY=0`` nothing is stored, and the line still has its reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    STANDIN_VERSION,
    VARIANT,
    Sandbox,
    Server,
    canonical_key,
    compile_args,
    hlo,
    read_run_manifest,
    stock_address,
    wait_for,
)

from neffcache.server.explain.reasons import CLIENT_REASONS, REASONS
from neffcache.server.index import open_index

pytestmark = pytest.mark.e2e

INSTANCE = "trn1.32xlarge"
MODEL = "e2e-model"
# The facts a graph event shares with its run-manifest line.
SHARED = (
    "via",
    "key",
    "direct_key",
    "neuron_address",
    "result",
    "source",
    "reason",
    "fetch_seconds",
    "compile_seconds",
    "outcome",
    "saved_seconds",
    "bytes",
    "compiler_version",
    "pid",
    "host",
)


def stored(server: Server, namespace: str) -> list[dict[str, Any]]:
    """Every event the server stored for ``namespace``, oldest first."""
    index = open_index(f"sqlite://{server.data_dir / 'index.db'}")
    try:
        found: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page, after = index.events(0.0, float("inf"), [namespace], after, 500)
            found += [json.loads(event.body) for event in page]
            if after is None:
                return found
    finally:
        index.close()


def stored_graphs(server: Server, namespace: str, count: int) -> list[dict[str, Any]]:
    """Every stored event of ``namespace`` once ``count`` graph events are in: the
    wrapper's go from a child of its own, which may still be sending as it exits."""
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        found[:] = stored(server, namespace)
        return sum(e["kind"] == "graph" for e in found) >= count

    wait_for(arrived, 30, f"{count} graph events")
    return found


def graphs(events: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "graph" and e.get("job_id") == job]


def counted(events: list[dict[str, Any]], job: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for event in events:
        if event["kind"] == "counters" and event.get("job_id") == job:
            for name, n in event["counts"].items():
                total[name] = total.get(name, 0) + n
    return total


def assert_event_matches(
    line: dict[str, Any], events: list[dict[str, Any]], skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The one stored event with this line's facts (unknown ones left out), but the
    fields in ``skip``."""
    shared = [name for name in SHARED if name not in skip]
    same = [
        e
        for e in events
        if all(e.get(name) == line.get(name) for name in shared if line.get(name) is not None)
        and all(name not in e for name in shared if line.get(name) is None)
    ]
    assert len(same) == 1, f"{len(same)} events match {line}; stored: {events}"
    return same[0]


def assert_server_reason(line: dict[str, Any]) -> None:
    """The line's reason is the server's explanation, not a client-side code."""
    assert line["reason"] in REASONS, line
    assert line["reason"] not in CLIENT_REASONS, line


def env_for(sandbox: Sandbox, url: str, manifest: Path, job: str, **extra: str) -> dict[str, str]:
    values = {
        "NEFFCACHE_RUN_MANIFEST": str(manifest),
        "NEFFCACHE_JOB_ID": job,
        "NEFFCACHE_INSTANCE_TYPE": INSTANCE,
        "NEFFCACHE_MODEL": MODEL,
        **extra,
    }
    hook = values.pop("hook", "") == "1"
    return sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=hook, extra=values)


# --- the compiler wrapper -------------------------------------------------------------


def test_wrapper_cold_warm_and_a_compiler_upgrade(private_server: Server, sandbox: Sandbox) -> None:
    server = private_server  # reasons depend on what the server knows: only this test's
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run.jsonl"
    key = canonical_key(BLOCK_A)

    cold = env_for(sandbox, url, manifest, "cold", NEFFCACHE_STANDIN_DELAY="0.2")
    sandbox.wrap(cold, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    warm = env_for(sandbox, url, manifest, "warm")
    sandbox.wrap(warm, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    upgraded = "2.21.1.0+deadbeef"
    new = env_for(sandbox, url, manifest, "upgrade", NEFFCACHE_STANDIN_VERSION=upgraded)
    sandbox.wrap(new, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    assert sandbox.compiles() == 2

    miss, hit, upgrade = read_run_manifest(manifest)
    assert (miss["result"], miss["key"], miss["outcome"]) == ("miss", key, "ok")
    assert miss["compile_seconds"] >= 0.2
    assert miss["reason"] == "new-graph", miss
    assert isinstance(miss["reason_summary"], str)
    assert miss["reason_summary"]
    assert miss["compiler_version"] == STANDIN_VERSION
    assert (hit["result"], hit["source"], hit["reason"]) == ("hit", "server", None)
    entry = server.entry(sandbox.namespace, key)
    assert entry is not None
    assert hit["saved_seconds"] == entry["compile_seconds"]
    assert hit["saved_seconds"] >= 0.2
    assert upgrade["result"] == "miss"
    assert upgrade["reason"] == "compiler-changed", upgrade
    assert upgrade["compiler_version"] == upgraded

    events = stored_graphs(server, sandbox.namespace, 3)
    for line, job in ((miss, "cold"), (hit, "warm"), (upgrade, "upgrade")):
        event = assert_event_matches(line, graphs(events, job))
        assert (event["instance_type"], event["model"]) == (INSTANCE, MODEL)
        assert isinstance(event["client_at"], float)
        assert "reason_summary" not in event
    cold_event = graphs(events, "cold")[0]
    components = cold_event["components"]
    assert components["fingerprint"] == entry["components"]["fingerprint"]
    assert components["compiler_version"] == STANDIN_VERSION
    assert len(components["graph"]["structure"]) == 64
    assert "components" not in graphs(events, "warm")[0]
    assert counted(events, "cold")["compiles"] == 1
    assert counted(events, "warm")["hits_server"] == 1


def test_wrapper_with_the_server_down_says_so(sandbox: Sandbox, unused_port: int) -> None:
    url = f"neffcache+http://127.0.0.1:{unused_port}/{sandbox.namespace}"
    manifest = sandbox.root / "run.jsonl"
    env = env_for(sandbox, url, manifest, "down", NEFFCACHE_CONNECT_TIMEOUT="0.5")
    sandbox.wrap(env, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    (line,) = read_run_manifest(manifest)
    assert (line["result"], line["outcome"]) == ("miss", "ok")
    assert line["reason"] == "server-unavailable"


def test_telemetry_off_stores_nothing_and_keeps_the_reason(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run.jsonl"
    env = env_for(sandbox, url, manifest, "quiet", NEFFCACHE_TELEMETRY="0")
    sandbox.wrap(env, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    (line,) = read_run_manifest(manifest)
    assert_server_reason(line)  # other tests' namespaces have it: "other-namespace"
    # The wrapper's events would go from a child after it exits: a later run's, once
    # stored, shows that the quiet one sent none.
    loud = env_for(sandbox, url, manifest, "loud")
    sandbox.wrap(loud, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    events = stored_graphs(server, sandbox.namespace, 1)
    assert {e.get("job_id") for e in events} == {"loud"}


class HoldingServer:
    """A loopback HTTP server that answers 404 to every request but ``POST
    /v1/events``, which it reads and holds, unanswered, until the test answers it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.held: queue.Queue[tuple[socket.socket, bytes]] = queue.Queue()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream, contextlib.suppress(OSError, ValueError):
            while True:
                head = [stream.readline()]
                while head[-1] not in (b"\r\n", b""):
                    head.append(stream.readline())
                if head[-1] == b"":
                    return
                length = 0
                for line in head[1:]:
                    name, _, value = line.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = stream.read(length)
                if head[0].startswith(b"POST /v1/events "):
                    self.held.put((conn.dup(), body))  # the test's to answer and close
                    return
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")

    def close(self) -> None:
        self._listener.close()


def client_closed(conn: socket.socket) -> bool:
    """Whether the other end closed ``conn`` (end of file), without waiting."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    finally:
        conn.setblocking(True)


# ``neffcache wrap`` as the shim runs it (os._exit at the end), with telemetry's bound
# on sending raised far above any wait of this test's.
_PATIENT_WRAP = (
    "from neffcache.client import telemetry; telemetry.EXIT_WAIT = 120.0; "
    "from neffcache.client.cli import main; main()"
)


def test_a_wrapper_hit_does_not_wait_for_the_events_answer(sandbox: Sandbox) -> None:
    """The SDK waits for the wrapper's exit: a hit hands its events to a child and
    exits while the server still holds the request; the child gets the answer."""
    import neffcache.client
    import neffcache.keying

    server = HoldingServer()
    try:
        url = f"neffcache+http://127.0.0.1:{server.port}/{sandbox.namespace}"
        l1 = sandbox.new_dir("l1")
        roots = [str(Path(m.__file__).parents[2]) for m in (neffcache.client, neffcache.keying)]
        extra = {"NEFFCACHE_LEASES": "0", "PYTHONPATH": os.pathsep.join(roots)}
        quiet = sandbox.env(l1=l1, url=url, extra={**extra, "NEFFCACHE_TELEMETRY": "0"})
        sandbox.wrap(quiet, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()  # into L1
        assert server.held.empty()

        out = sandbox.new_dir("out") / "a.neff"
        argv = [sys.executable, "-c", _PATIENT_WRAP, "wrap", "--", "neuronx-cc"]
        argv += compile_args(hlo(BLOCK_A), out)
        hit = sandbox.run(argv, sandbox.env(l1=l1, url=url, extra=extra), timeout=60).check()
        assert out.read_bytes()
        assert sandbox.compiles() == 1
        conn, body = server.held.get(timeout=60)  # the events, sent by now or soon
        with conn:
            # The wrapper is gone, its events' request still open and unanswered.
            assert not client_closed(conn), hit.describe()
            (event,) = [e for e in json.loads(body)["events"] if e["kind"] == "graph"]
            assert (event["via"], event["result"], event["source"]) == ("wrapper", "hit", "l1")
            conn.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\n{}")
            # The child read the answer and ended.
            conn.settimeout(60)
            assert conn.recv(1) == b""
    finally:
        server.close()


# --- the persistent-cache hook ----------------------------------------------------------


@pytest.mark.parametrize("hlo_first", ["0", "1"], ids=["probe-first", "hlo-first"])
def test_hook_cold_then_warm(private_server: Server, sandbox: Sandbox, hlo_first: str) -> None:
    server = private_server
    url = server.cache_url(sandbox.namespace)
    names = [BLOCK_A, VARIANT]
    manifest = sandbox.root / "run.jsonl"
    extra = {"hook": "1", "NEFFCACHE_STANDIN_HLO_FIRST": hlo_first}

    sandbox.train(env_for(sandbox, url, manifest, "cold", **extra), names).done.check()
    warm = env_for(sandbox, url, manifest, "warm", **extra)
    sandbox.train(warm, names).done.check()
    sandbox.train(warm, names).done.check()  # the same L1 again: L1 hits
    assert sandbox.compiles() == 2

    lines = read_run_manifest(manifest)
    assert len(lines) == 6
    misses, hits, l1_hits = lines[:2], lines[2:4], lines[4:]
    for line, name in zip(misses, names, strict=True):
        assert line["neuron_address"] == stock_address(name)
        assert (line["result"], line["outcome"]) == ("miss", "ok")
        assert_server_reason(line)
        assert line["key"] is None  # the hook's lines name a graph by address (prewarm)
    assert misses[0]["reason"] == "new-graph"
    # The same structure at other shapes, once block_a's publish reached the server.
    assert misses[1]["reason"] in ("new-graph", "shapes-changed")
    for line, miss in zip(hits, misses, strict=True):
        assert (line["result"], line["source"]) == ("hit", "server")
        entry = server.alias(sandbox.namespace, miss["neuron_address"])
        assert entry is not None
        assert line["saved_seconds"] == entry["compile_seconds"]
    for line, hit in zip(l1_hits, hits, strict=True):
        assert (line["result"], line["source"]) == ("hit", "l1")
        assert line["saved_seconds"] == hit["saved_seconds"]

    events = stored(server, sandbox.namespace)
    for line, job in zip(lines, ["cold"] * 2 + ["warm"] * 4, strict=True):
        skip = ("key", "direct_key") if line["result"] == "miss" else ()
        event = assert_event_matches(line, graphs(events, job), skip)
        assert event["via"] == "hook"
        assert event["instance_type"] == INSTANCE
    for event, name in zip(graphs(events, "cold"), names, strict=True):
        # The miss's event has the keys its explanation was asked with.
        assert event["key"] == canonical_key(name)
        assert len(event["direct_key"]) == 64
        assert event["components"]["fingerprint"]
        assert event["components"]["graph"]["instructions"] > 0
    assert counted(events, "cold")["compiles"] == 2
    assert counted(events, "warm")["hits_server"] == 2
    assert counted(events, "warm")["hits_l1"] == 2


def test_hook_and_shim_count_each_graph_once(private_server: Server, sandbox: Sandbox) -> None:
    server = private_server
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run.jsonl"

    def env(job: str) -> dict[str, str]:
        values = {"NEFFCACHE_RUN_MANIFEST": str(manifest), "NEFFCACHE_JOB_ID": job}
        return sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True, shim=True, extra=values)

    sandbox.train(env("cold"), [BLOCK_A]).done.check()
    sandbox.train(env("warm"), [BLOCK_B]).done.check()  # another trace: the wrapper's hit
    assert sandbox.compiles() == 1

    lines = read_run_manifest(manifest)
    by_via = {(line["via"], line["result"], line.get("resolved_by")) for line in lines}
    assert by_via == {
        ("wrapper", "miss", None),
        ("hook", "delegated", "wrapper"),
        ("wrapper", "hit", None),
    }, lines
    assert len(lines) == 4
    events = stored_graphs(server, sandbox.namespace, 2)
    for job, result in (("cold", "miss"), ("warm", "hit")):
        (event,) = graphs(events, job)  # the wrapper's; the hook's line has none
        assert (event["via"], event["result"]) == ("wrapper", result)
    (wrapped_miss,) = [
        line for line in lines if line["via"] == "wrapper" and line["result"] == "miss"
    ]
    assert wrapped_miss["reason"] == "new-graph"


def test_the_cost_report_adds_up_the_events(private_server: Server, sandbox: Sandbox) -> None:
    server = private_server
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run.jsonl"
    for job in ("cold", "warm"):
        env = env_for(sandbox, url, manifest, job, NEFFCACHE_STANDIN_DELAY="0.2")
        sandbox.wrap(env, BLOCK_A, sandbox.new_dir("out") / "a.neff").check()
    miss, hit = read_run_manifest(manifest)
    stored_graphs(server, sandbox.namespace, 2)

    response = server.get(f"/v1/reports/cost?since=0&by=job&namespace={sandbox.namespace}")
    assert response.status_code == 200, response.text
    report = response.json()
    totals = report["totals"]
    assert (totals["lookups"], totals["hits_server"], totals["misses"]) == (2, 1, 1)
    assert totals["miss_reasons"] == {"new-graph": 1}
    assert totals["compile_hours_spent"] == pytest.approx(miss["compile_seconds"] / 3600, rel=1e-3)
    assert totals["compile_hours_saved"] == pytest.approx(hit["saved_seconds"] / 3600, rel=1e-3)
    assert totals["cost_saved"] is not None  # trn1.32xlarge is priced
    assert report["runs"]["cold"] == report["runs"]["warm"] == 1
    (top,) = report["top_misses"]
    assert (top["key"], top["reason"], top["model"]) == (miss["key"], "new-graph", MODEL)
