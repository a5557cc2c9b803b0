"""Unit tests for the client's telemetry (telemetry.py), the shared run-manifest line
and event (runlog.graph), and miss explanations (reasons.py), against a real loopback
HTTP server started here that records every request.

No timed assertions: "the caller never waits" is shown by the server still holding a
request (a gate the test opens) when the caller has already returned.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from loopback import free_port
from support.client_units import delta, no_server_down

from neffcache.client import runlog, telemetry
from neffcache.client.config import JOB_ID_VARIABLES, ClientConfig, job_id
from neffcache.client.reasons import (
    CLIENT_REASONS,
    FAILED_BEFORE,
    SERVER_UNAVAILABLE,
    UNKEYABLE,
    UNKNOWN,
    Explanation,
    Prepared,
)
from neffcache.client.remote import TELEMETRY, Remote
from neffcache.client.stats import STATS
from neffcache.client.telemetry import MAX_BATCH, MAX_BATCH_BYTES, Sender

Route = Callable[[str, str, bytes], tuple[int, bytes]]
HLO_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hlo" / "block_a.pb"


def accept(method: str, path: str, body: bytes) -> tuple[int, bytes]:
    if path == "/v1/events":
        return 202, json.dumps({"accepted": len(json.loads(body)["events"])}).encode()
    return 404, b'{"detail": "not found"}'


class Recorder:
    """A loopback HTTP server that records each request and answers with ``route``;
    while ``gate`` is closed every request is held (``arrived`` is set once one is)."""

    def __init__(self, route: Route = accept) -> None:
        self.route = route
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body))
                outer.arrived.set()
                outer.gate.wait(30)
                status, answer = outer.route(self.command, self.path, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the client gave up on a held request
                    pass

            do_GET = do_POST = do_PUT = _answer  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def batches(self) -> list[list[dict[str, Any]]]:
        return [
            json.loads(body)["events"]
            for method, path, _, body in self.requests
            if (method, path) == ("POST", "/v1/events")
        ]

    def graphs(self) -> list[dict[str, Any]]:
        return [e for batch in self.batches() for e in batch if e["kind"] == "graph"]

    def counters(self) -> list[dict[str, int]]:
        return [e["counts"] for batch in self.batches() for e in batch if e["kind"] == "counters"]

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def recorder(route: Route = accept) -> Iterator[Recorder]:
    server = Recorder(route)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    no_server_down(monkeypatch)
    monkeypatch.setattr(telemetry, "_detected", {})


def make_config(tmp_path: Path, url: str, **extra: str) -> ClientConfig:
    env = {
        "NEFFCACHE_URL": f"neffcache+{url}/team-a",
        "NEFFCACHE_LOCAL_DIR": str(tmp_path / "l1"),
        "NEFFCACHE_CONNECT_TIMEOUT": "1",
        "NEFFCACHE_TIMEOUT": "5",
        **extra,
    }
    config = ClientConfig.from_env(env)
    assert config is not None
    return config


def event(n: int, pad: int = 0) -> dict[str, Any]:
    return {
        "kind": "graph",
        "namespace": "team-a",
        "result": "hit",
        "pid": n,
        "fallback": "x" * pad,
    }


@contextlib.contextmanager
def inline_sender(**kwargs: Any) -> Iterator[Sender]:
    sender = Sender(threaded=False, **kwargs)
    try:
        yield sender
    finally:
        for remote in sender._remotes.values():
            remote.close()


# --- batches and bounds ------------------------------------------------------------------


def test_a_flush_sends_everything_in_order_in_batches_of_at_most_500(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        for n in range(1200):
            sender.enqueue(config, event(n))
        assert server.requests == []  # queued, not sent
        assert sender.flush(timeout=30)
    batches = server.batches()
    assert [len([e for e in b if e["kind"] == "graph"]) for b in batches] == [500, 500, 200]
    assert [e["pid"] for e in server.graphs()] == list(range(1200))
    assert sender.pending() == 0
    assert MAX_BATCH == 500


def test_batches_stay_under_one_mebibyte(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        for n in range(9):
            sender.enqueue(config, event(n, pad=300_000))
        assert sender.flush(timeout=30)
    sizes = [len(body) for m, p, _, body in server.requests if p == "/v1/events"]
    assert len(sizes) >= 3
    assert all(size <= MAX_BATCH_BYTES for size in sizes), sizes
    assert [e["pid"] for e in server.graphs()] == list(range(9))


def test_a_full_queue_drops_the_oldest_and_counts_it(tmp_path: Path) -> None:
    before = STATS.snapshot()
    with recorder() as server, inline_sender(max_queue=5) as sender:
        config = make_config(tmp_path, server.url)
        for n in range(8):
            sender.enqueue(config, event(n))
        assert sender.pending() == 5
        assert delta(before, "telemetry_dropped") == 3
        assert sender.flush(timeout=30)
    assert [e["pid"] for e in server.graphs()] == [3, 4, 5, 6, 7]


def test_requests_carry_the_token_and_json(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url, NEFFCACHE_TOKEN="s3cret")
        sender.enqueue(config, event(1))
        assert sender.flush(timeout=30)
    ((method, path, headers, _),) = server.requests
    assert (method, path) == ("POST", "/v1/events")
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Content-Type"] == "application/json"


# --- trouble: the server down, slow, or refusing ------------------------------------------


def test_a_server_error_backs_telemetry_off_and_keeps_the_events(tmp_path: Path) -> None:
    def failing(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 503, b""

    with recorder(failing) as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        for n in range(3):
            sender.enqueue(config, event(n))
        assert not sender.flush(timeout=30)
        assert len(server.requests) == 1
        assert sender.pending() == 3  # kept for later
        remote = Remote(config)
        assert not remote.available(TELEMETRY)
        assert remote.available()  # the cache still asks the server
        assert not sender.flush(timeout=30)
        assert len(server.requests) == 1  # backed off: not asked again


def test_a_refused_connection_backs_off_without_marking_the_server_down(tmp_path: Path) -> None:
    with inline_sender() as sender:
        config = make_config(tmp_path, f"http://127.0.0.1:{free_port()}")
        sender.enqueue(config, event(1))
        assert not sender.flush(timeout=30)
        assert sender.pending() == 1
        assert Remote(config).available()
        assert not Remote(config).available(TELEMETRY)


def test_nothing_is_sent_while_the_server_is_marked_down(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        Remote(config)._mark_down("a lookup", "a test")
        sender.enqueue(config, event(1))
        assert not sender.flush(timeout=30)
    assert server.requests == []
    assert sender.pending() == 1


def test_the_caller_never_waits_for_a_slow_server(tmp_path: Path) -> None:
    with recorder() as server:
        server.gate.clear()  # every request is held until the test opens the gate
        config = make_config(tmp_path, server.url)
        sender = Sender(threaded=True, linger=0.01)
        sender.enqueue(config, event(0))
        assert server.arrived.wait(30), "the thread never sent"
        for n in range(1, 50):
            sender.enqueue(config, event(n))  # returns while the request is held
        assert not server.gate.is_set()
        assert sender.pending() == 50  # one in the held request, 49 queued
        server.gate.set()
        assert sender.flush(timeout=30)
    assert sorted(e["pid"] for e in server.graphs()) == list(range(50))


def test_a_server_slower_than_the_timeout_backs_telemetry_off(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        server.gate.clear()
        config = make_config(tmp_path, server.url, NEFFCACHE_TIMEOUT="0.3")
        sender.enqueue(config, event(1))
        assert not sender.flush(timeout=30)
        assert sender.pending() == 1
        assert not Remote(config).available(TELEMETRY)
        assert Remote(config).available()


def test_the_exit_flush_is_bounded(tmp_path: Path) -> None:
    before = STATS.snapshot()
    with recorder() as server:
        server.gate.clear()
        config = make_config(tmp_path, server.url, NEFFCACHE_TIMEOUT="60")
        sender = Sender(threaded=True, linger=3600)
        sender.enqueue(config, event(1))
        sender.at_exit(timeout=0.2)
        # It returned with the request still held by the server: bounded by itself.
        assert server.arrived.is_set()
        assert not server.gate.is_set()
        assert delta(before, "telemetry_unsent") == 1


def test_a_batch_the_server_refuses_is_dropped_and_counted(tmp_path: Path) -> None:
    def refusing(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 400, b'{"detail": "unknown field"}'

    before = STATS.snapshot()
    with recorder(refusing) as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        sender.enqueue(config, event(1))
        sender.enqueue(config, event(2))
        assert sender.flush(timeout=30)  # nothing left: dropped, not retried
        assert len(server.requests) == 1
    assert delta(before, "telemetry_rejected") == 2
    assert Remote(config).available(TELEMETRY)  # a refusal is not trouble


def test_a_server_without_events_gets_no_more(tmp_path: Path) -> None:
    def old(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 404, b'{"detail": "Not Found"}'

    with recorder(old) as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        sender.enqueue(config, event(1))
        sender.flush(timeout=30)
        sender.enqueue(config, event(2))
        sender.flush(timeout=30)
        assert len(server.requests) == 1


def test_an_event_that_is_not_json_is_dropped_alone(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        sender.enqueue(config, {**event(1), "fetch_seconds": float("nan")})
        sender.enqueue(config, event(2))
        assert sender.flush(timeout=30)
    assert [e["pid"] for e in server.graphs()] == [2]


# --- counters ---------------------------------------------------------------------------


def not_telemetry(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if not k.startswith("telemetry_")}


def test_counters_go_as_rises_since_the_last_accepted_ones(tmp_path: Path) -> None:
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        sender.enqueue(config, event(1))
        assert sender.flush(timeout=30)
        first = server.counters()
        assert len(first) == 1  # with the first batch: every counter so far
        STATS.count("test_telemetry_hits", 3)
        sender.enqueue(config, event(2))
        assert sender.flush(timeout=30)
        assert not_telemetry(server.counters()[-1]) == {"test_telemetry_hits": 3}
        STATS.count("test_telemetry_hits", 2)
        assert sender.flush(timeout=30)  # no graph queued: the counters go alone
        assert not_telemetry(server.counters()[-1]) == {"test_telemetry_hits": 2}
        requests = len(server.requests)
        assert sender.flush(timeout=30)  # nothing rose: nothing sent
        assert len(server.requests) == requests
    for counts in server.counters():
        assert all(isinstance(v, int) and v > 0 for v in counts.values())
        assert len(counts) <= 64


def test_counters_refused_by_trouble_go_with_the_next_accepted_batch(tmp_path: Path) -> None:
    answers = iter([202, 503])

    def flaky(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        status = next(answers, 202)
        return (status, b"") if status != 202 else accept(method, path, body)

    with recorder(flaky) as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url, NEFFCACHE_BACKOFF="0")
        sender.enqueue(config, event(0))
        assert sender.flush(timeout=30)  # every counter so far is reported with it
        STATS.count("test_telemetry_later", 4)
        sender.enqueue(config, event(1))
        assert not sender.flush(timeout=30)  # 503: nothing accepted
        assert sender.flush(timeout=30)
    assert len(server.requests) == 3
    last = server.batches()[-1]
    assert [e["pid"] for e in last if e["kind"] == "graph"] == [1]  # sent again, after the 503
    assert not_telemetry(server.counters()[-1]) == {"test_telemetry_later": 4}


# --- the thread ---------------------------------------------------------------------------


def test_the_thread_sends_without_a_flush(tmp_path: Path) -> None:
    with recorder() as server:
        config = make_config(tmp_path, server.url)
        sender = Sender(threaded=True, linger=0.01)
        sender.enqueue(config, event(7))
        assert server.arrived.wait(30)
        assert sender.flush(timeout=30)
    assert [e["pid"] for e in server.graphs()] == [7]


def test_enqueue_never_waits_for_a_batchs_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events are serialized outside the queue's lock: the training thread's enqueue
    never waits for up to 500 events' JSON (1 MiB) on the sender's thread."""
    with recorder() as server, inline_sender() as sender:
        held_while_dumping: list[bool] = []
        dumps = telemetry._dumps

        def watched(value: Any) -> bytes:
            held_while_dumping.append(sender._lock.locked())
            return dumps(value)

        monkeypatch.setattr(telemetry, "_dumps", watched)
        config = make_config(tmp_path, server.url)
        for n in range(20):
            sender.enqueue(config, event(n, pad=100))
        assert sender.flush(timeout=30)
    assert len(held_while_dumping) >= 20
    assert not any(held_while_dumping)
    assert [e["pid"] for e in server.graphs()] == list(range(20))


def test_a_backed_off_sender_serializes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While telemetry is backed off, a cycle is a look at the back-off: a full queue
    is not serialized again on every wake-up (each enqueue wakes it past 500)."""
    with recorder() as server, inline_sender() as sender:
        config = make_config(tmp_path, server.url)
        Remote(config)._mark_down("sending telemetry", "a test", TELEMETRY)
        for n in range(MAX_BATCH + 10):
            sender.enqueue(config, event(n))
        dumped: list[Any] = []
        monkeypatch.setattr(telemetry, "_dumps", lambda value: dumped.append(value) or b"{}")
        for _ in range(3):
            assert not sender.flush(timeout=30)
        assert dumped == []
        assert sender.pending() == MAX_BATCH + 10
    assert server.requests == []


def test_without_a_thread_to_be_had_the_exit_flush_sends_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with recorder() as server:
        sender = Sender(threaded=True, linger=3600)
        config = make_config(tmp_path, server.url)
        monkeypatch.setattr(threading.Thread, "start", refuse)
        sender.enqueue(config, event(1))  # no exception: the call goes on
        monkeypatch.undo()
        sender.at_exit(timeout=30)  # not a wait for a thread that never ran
        assert [e["pid"] for e in server.graphs()] == [1]
        for remote in sender._remotes.values():
            remote.close()


# --- forked children ----------------------------------------------------------------------

# Run in a fresh interpreter (this one has threads of its own): a thread holds the
# counters' lock and the back-off's lock while the process forks, as telemetry's
# thread may at any moment; the child must still count and ask the back-off.
_FORK_WHILE_HELD = """
import os, sys, threading, time
from neffcache.client import remote, telemetry
from neffcache.client.config import ClientConfig
from neffcache.client.stats import STATS

config = ClientConfig.from_env(
    {"NEFFCACHE_URL": "neffcache+http://127.0.0.1:9/ns", "NEFFCACHE_LOCAL_DIR": sys.argv[1]}
)
held, done = threading.Event(), threading.Event()

def hold():
    with STATS._lock, remote._down_lock:
        held.set()
        done.wait()

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    STATS.count("in_child")
    remote.Remote(config).available(remote.TELEMETRY)
    os._exit(7)
done.set()
for _ in range(200):
    found, status = os.waitpid(pid, os.WNOHANG)
    if found:
        print(os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("hung")
"""

_CHILD_COUNTERS = """
import os, sys
from neffcache.client import telemetry
from neffcache.client.stats import STATS

STATS.count("hits_l1", 5)
telemetry.sender(threaded=False)
pid = os.fork()
if pid == 0:
    STATS.count("hits_l1", 1)
    rises = telemetry.sender(threaded=False)._rises(STATS.snapshot())
    os.write(1, repr(rises.get("hits_l1")).encode())
    os._exit(0)
os.waitpid(pid, 0)
"""


def _run_script(script: str, *args: str) -> str:
    import subprocess
    import sys

    import neffcache.client
    import neffcache.keying

    roots = [str(Path(m.__file__).parents[2]) for m in (neffcache.client, neffcache.keying)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(roots)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.e2e
def test_a_child_forked_while_a_thread_held_the_locks_does_not_hang(tmp_path: Path) -> None:
    assert _run_script(_FORK_WHILE_HELD, str(tmp_path)) == "7"


@pytest.mark.e2e
def test_a_forked_childs_counters_count_from_the_fork(tmp_path: Path) -> None:
    """The parent reports what it counted before the fork; the child only its own."""
    assert _run_script(_CHILD_COUNTERS) == "1"


# --- identity -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("trn1.32xlarge\n", "trn1.32xlarge"),
        ("trn2u.48xlarge", "trn2u.48xlarge"),
        ("inf2.xlarge", "inf2.xlarge"),
        ("c7i.metal-24xl", "c7i.metal-24xl"),
        ("HVM domU", None),
        ("Standard PC (Q35 + ICH9, 2009)", None),
        ("", None),
    ],
)
def test_the_instance_type_comes_from_the_dmi(tmp_path: Path, text: str, found: str | None) -> None:
    dmi = tmp_path / "product_name"
    dmi.write_text(text)
    config = make_config(tmp_path, "http://127.0.0.1:1")
    assert telemetry.identity(config, str(dmi)).get("instance_type") == found


def test_the_instance_type_variable_wins_and_no_dmi_is_none(tmp_path: Path) -> None:
    dmi = tmp_path / "product_name"
    dmi.write_text("trn1.32xlarge")
    config = make_config(tmp_path, "http://x:1", NEFFCACHE_INSTANCE_TYPE="trn2.48xlarge")
    assert telemetry.identity(config, str(dmi))["instance_type"] == "trn2.48xlarge"
    plain = make_config(tmp_path, "http://x:1")
    assert "instance_type" not in telemetry.identity(plain, str(tmp_path / "absent"))


def test_identity_names_namespace_host_job_and_model(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, "http://x:1", NEFFCACHE_JOB_ID="job-7", NEFFCACHE_MODEL="llama-8b"
    )
    found = telemetry.identity(config, str(tmp_path / "absent"))
    assert found["namespace"] == "team-a"
    assert found["job_id"] == "job-7"
    assert found["model"] == "llama-8b"
    assert found["host"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"NEFFCACHE_JOB_ID": "mine", "SLURM_JOB_ID": "42"}, "mine"),
        ({"SLURM_JOB_ID": "42", "AWS_BATCH_JOB_ID": "b"}, "42"),
        ({"AWS_BATCH_JOB_ID": "0e1f-aa#3"}, "0e1f-aa"),
        ({"AWS_BATCH_JOB_ID": "0e1f-aa:7"}, "0e1f-aa:7"),
        ({"TRAINING_JOB_NAME": "sm-job"}, "sm-job"),
        ({"PBS_JOBID": "12[3].pbs"}, "12[3].pbs"),
        ({"LSB_JOBID": "88", "LSB_JOBINDEX": "0"}, "88"),
        ({"LSB_JOBID": "88", "LSB_JOBINDEX": "5"}, "88[5]"),
        ({"TORCHELASTIC_RUN_ID": "none"}, None),
        ({"TORCHELASTIC_RUN_ID": "rdzv-9"}, "rdzv-9"),
        ({"NEFFCACHE_JOB_ID": "  ", "SLURM_JOB_ID": "42"}, "42"),
        ({"NEFFCACHE_JOB_ID": "x" * 256}, None),
        ({"SLURM_JOB_ID": "bad\nid", "PBS_JOBID": "9"}, "9"),
    ],
)
def test_job_id(env: dict[str, str], expected: str | None) -> None:
    assert job_id(env) == expected


def test_every_job_id_variable_is_read() -> None:
    for variable in JOB_ID_VARIABLES:
        assert job_id({variable: "id-1"}) == "id-1", variable


# --- events from run-manifest lines --------------------------------------------------------


def test_a_graph_event_has_the_lines_fields_and_no_nulls(tmp_path: Path) -> None:
    config = make_config(tmp_path, "http://x:1", NEFFCACHE_JOB_ID="j")
    line = {
        "time": "2026-01-01T00:00:00.000+00:00",
        "via": "wrapper",
        "key": "a" * 64,
        "direct_key": None,
        "result": "miss",
        "source": "compiler",
        "reason": "flags-changed",
        "reason_summary": "flag --optlevel differs: 1 vs 2",
        "compile_seconds": 12.5,
        "outcome": "ok",
        "fallback": "f" * 300,
        "exit_code": 0,
        "events": {"compiles": 1},
        "pid": 12,
        "host": "h",
    }
    found = telemetry.graph_event(config, line, 1000.0, {"fingerprint": "b" * 64})
    assert found["kind"] == "graph"
    assert found["at"] == 1000.0
    assert found["job_id"] == "j"
    assert found["reason"] == "flags-changed"
    assert len(found["fallback"]) == 64
    assert found["components"] == {"fingerprint": "b" * 64}
    for absent in ("direct_key", "time", "exit_code", "events", "reason_summary"):
        assert absent not in found
    assert set(found) - {"kind", "at", "namespace", "job_id", "host", "components"} <= set(
        telemetry.GRAPH_FIELDS
    )
    hit = telemetry.graph_event(config, {**line, "result": "hit"}, 1.0, {"fingerprint": "c"})
    assert "components" not in hit  # components are for misses


def test_an_events_fallback_is_its_kind_and_names_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run manifest keeps a fall-back's details; the event, sent off the host,
    only what kind it was: an error's message may name a file of the job's."""
    sender = _sender_for(monkeypatch)
    run = tmp_path / "run.jsonl"
    config = make_config(tmp_path, "http://x:1", NEFFCACHE_RUN_MANIFEST=str(run))
    why = "cannot key: [Errno 13] Permission denied: '/home/alice/secret-model/g.pb'"
    runlog.graph(config, via="wrapper", result="miss", source="compiler", fallback=why)
    (line,) = [json.loads(x) for x in run.read_text().splitlines()]
    assert line["fallback"] == why
    ((_, sent),) = list(sender._queue)
    assert sent["fallback"] == "cannot key"
    assert "alice" not in json.dumps(sent)
    plain = telemetry.graph_event(config, {"result": "miss", "fallback": "no compiler version"}, 1)
    assert plain["fallback"] == "no compiler version"


def test_components_are_bounded() -> None:
    shapes = [f"add f32[{n}]" for n in range(3000)]
    small = {"fingerprint": "a", "graph": {"structure": "s", "instructions": 10, "shapes": ["x"]}}
    assert telemetry.bounded_components(small) == small
    large = {
        "fingerprint": "a",
        "graph": {"structure": "s", "instructions": 3000, "shapes": shapes},
    }
    assert telemetry.bounded_components(large) == {
        "fingerprint": "a",
        "graph": {"structure": "s", "instructions": 3000},
    }
    wide = {
        "fingerprint": "a",
        "graph": {"structure": "s", "instructions": 2000, "shapes": shapes[:2000] * 5},
    }
    bounded = telemetry.bounded_components(wide)
    assert bounded is not None
    assert "shapes" not in bounded["graph"]
    assert len(json.dumps(bounded)) <= telemetry.MAX_COMPONENTS_BYTES
    assert telemetry.bounded_components({"env": {"X": "y" * 70_000}}) is None


def _sender_for(monkeypatch: pytest.MonkeyPatch) -> Sender:
    sender = Sender(threaded=False)
    monkeypatch.setattr(telemetry, "_sender", [sender])
    return sender


def test_one_line_and_one_event_per_graph_with_the_same_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = _sender_for(monkeypatch)
    config = make_config(tmp_path, "http://x:1", NEFFCACHE_RUN_MANIFEST=str(tmp_path / "run.jsonl"))
    runlog.graph(
        config,
        {"fingerprint": "f" * 64},
        via="wrapper",
        key="a" * 64,
        result="miss",
        source="compiler",
        compile_seconds=3.25,
        outcome="ok",
        reason="new-graph",
        reason_summary="never seen",
        exit_code=0,
    )
    (line,) = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    ((_, sent),) = list(sender._queue)
    for name in telemetry.GRAPH_FIELDS:
        if line[name] is not None:
            assert sent[name] == line[name], name
        else:
            assert name not in sent, name
    assert line["reason_summary"] == "never seen"
    assert line["saved_seconds"] is None  # every line has every field
    assert sent["components"] == {"fingerprint": "f" * 64}


def test_telemetry_off_writes_the_line_and_queues_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = _sender_for(monkeypatch)
    run = tmp_path / "run.jsonl"
    config = make_config(
        tmp_path, "http://x:1", NEFFCACHE_TELEMETRY="0", NEFFCACHE_RUN_MANIFEST=str(run)
    )
    assert config.telemetry is False
    runlog.graph(config, via="hook", result="hit", source="l1")
    assert sender.pending() == 0
    assert len(run.read_text().splitlines()) == 1
    on = make_config(tmp_path, "http://x:1")
    assert on.telemetry is True
    runlog.graph(on, via="hook", result="hit", source="l1")  # no manifest: the event alone
    assert sender.pending() == 1
    assert len(run.read_text().splitlines()) == 1


class _Stock:
    """The one attribute of the SDK's cache that Core reads here."""

    def __init__(self, root: Path) -> None:
        self.cache_path = str(root)


def test_a_compile_the_wrapper_ran_on_a_collected_graph_is_one_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """neuron_parallel_compile's workers compile graphs a trial run wrote earlier, in
    another process: the hook never sees their HLO come. When its compile ran the
    wrapper's shim, the hook's line still says so and sends no second event."""
    from neffcache.client.proxy import Core

    sender = _sender_for(monkeypatch)
    run = tmp_path / "run.jsonl"
    config = make_config(
        tmp_path,
        f"http://127.0.0.1:{free_port()}",
        NEFFCACHE_RUN_MANIFEST=str(run),
        NEFFCACHE_LEASES="0",
    )
    root = Path(config.local_dir)
    address = "neuronxcc-2.20.9961.0+0acef03a/MODULE_123+abcdef01"
    entry = root / address
    entry.mkdir(parents=True)
    hlo = entry / "model.hlo_module.pb"
    hlo.write_bytes(HLO_FIXTURE.read_bytes())  # by the trial run, long before
    (entry / "compile_flags.json").write_text('["--target=trn1"]')
    core = Core(_Stock(root), config)
    before = STATS.snapshot()
    try:
        core.acquire_entry(str(hlo))
        core.mark_entry(str(hlo))
        core.local.note_wrapped(address)  # the shim's wrapper compiled it meanwhile
        (entry / "model.neff").write_bytes(b"NEFF")
        (entry / "model.done").write_text("")
        core.uploaded(str(entry / "model.done"))
        core.release_entry(str(hlo))
    finally:
        core.remote.close()
    (line,) = [json.loads(x) for x in run.read_text().splitlines()]
    assert (line["via"], line["result"], line["resolved_by"]) == ("hook", "delegated", "wrapper")
    assert (line["source"], line["reason"]) == ("wrapper", None)  # the wrapper's line has them
    assert [e for _, e in sender._queue if e["kind"] == "graph"] == []
    # The wrapper's process counted it (a compile, or a hit), not this one.
    assert delta(before, "compiles") == 0


def test_the_wrappers_note_for_the_hook_is_one_utime_not_a_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every wrapper hit notes its graph for the hook: a temporary file and a rename
    each time would cost the hit path more than the note is worth."""
    from neffcache.client.local import LocalStore

    local = LocalStore(str(tmp_path / "l1"))
    local.note_wrapped("neuronxcc-2.20/MODULE_1+abcdef01")  # the first makes the file

    def no_rename(*args: Any) -> None:
        raise OSError("no rename on the hit path")

    monkeypatch.setattr(os, "replace", no_rename)
    monkeypatch.setattr(os, "rename", no_rename)
    before = time.time()
    local.note_wrapped("neuronxcc-2.20/MODULE_1+abcdef01")
    assert local.wrapped_since("neuronxcc-2.20/MODULE_1+abcdef01", before)
    assert not local.wrapped_since("neuronxcc-2.20/MODULE_1+abcdef01", before + 3600)
    assert not local.wrapped_since("neuronxcc-2.20/MODULE_2+abcdef01", 0.0)


@pytest.mark.parametrize("value", ["0", "false", "no", "off"])
def test_telemetry_off_values(tmp_path: Path, value: str) -> None:
    assert make_config(tmp_path, "http://x:1", NEFFCACHE_TELEMETRY=value).telemetry is False


# --- explanations -----------------------------------------------------------------------


def explained(body: dict[str, Any]) -> Route:
    def route(method: str, path: str, data: bytes) -> tuple[int, bytes]:
        if path == "/v1/ns/team-a/explain":
            return 200, json.dumps(body).encode()
        return 404, b"{}"

    return route


PREPARED = Prepared(
    "a" * 64,
    "d" * 64,
    {"fingerprint": "f" * 64, "graph": {"structure": "s" * 64, "instructions": 3}},
)


def test_an_explanation_asks_with_the_key_components_and_graph(tmp_path: Path) -> None:
    answer = {"reason": "compiler-changed", "summary": "compiled before under 2.20"}
    with recorder(explained(answer)) as server:
        remote = Remote(make_config(tmp_path, server.url))
        explanation = Explanation(remote, lambda: PREPARED)
        assert explanation.result(wait=30) == ("compiler-changed", "compiled before under 2.20")
    ((method, path, _, body),) = server.requests
    assert (method, path) == ("POST", "/v1/ns/team-a/explain")
    assert json.loads(body) == {
        "key": "a" * 64,
        "components": {"fingerprint": "f" * 64},
        "graph": {"structure": "s" * 64, "instructions": 3},
    }
    assert explanation.prepared == PREPARED


def test_an_unkeyable_graph_is_not_asked_about(tmp_path: Path) -> None:
    with recorder(explained({"reason": "new-graph"})) as server:
        explanation = Explanation(Remote(make_config(tmp_path, server.url)), lambda: None)
        assert explanation.result(wait=30) == (UNKEYABLE, None)
    assert server.requests == []


def test_a_server_in_trouble_is_server_unavailable(tmp_path: Path) -> None:
    def failing(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        return 502, b""

    with recorder(failing) as server:
        config = make_config(tmp_path, server.url)
        explanation = Explanation(Remote(config), lambda: PREPARED)
        assert explanation.result(wait=30) == (SERVER_UNAVAILABLE, None)
        assert Remote(config).available()  # the cache is not skipped for it
    down = Explanation(
        Remote(make_config(tmp_path, f"http://127.0.0.1:{free_port()}")), lambda: PREPARED
    )
    assert down.result(wait=30) == (SERVER_UNAVAILABLE, None)


def test_no_answer_in_time_is_unknown(tmp_path: Path) -> None:
    with recorder(explained({"reason": "new-graph"})) as server:
        server.gate.clear()
        explanation = Explanation(Remote(make_config(tmp_path, server.url)), lambda: PREPARED)
        assert explanation.result(wait=0.05) == (UNKNOWN, None)
        server.gate.set()


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, {"detail": "Not Found"}), (200, {"summary": "no reason"}), (200, {"reason": 7})],
)
def test_an_answer_without_a_reason_is_unknown(
    tmp_path: Path, status: int, body: dict[str, Any]
) -> None:
    def route(method: str, path: str, data: bytes) -> tuple[int, bytes]:
        return status, json.dumps(body).encode()

    with recorder(route) as server:
        explanation = Explanation(Remote(make_config(tmp_path, server.url)), lambda: PREPARED)
        assert explanation.result(wait=30) == (UNKNOWN, None)


@pytest.mark.parametrize("reason", ["new-graph\nsee the log", "New Graph", "x" * 65])
def test_a_reason_that_is_not_a_code_is_unknown(tmp_path: Path, reason: str) -> None:
    """The line keeps a reason as given, the event without control characters and cut
    to 64: only a code can be both, so that the two never differ."""
    with recorder(explained({"reason": reason, "summary": "s"})) as server:
        explanation = Explanation(Remote(make_config(tmp_path, server.url)), lambda: PREPARED)
        assert explanation.result(wait=30) == (UNKNOWN, None)


def test_client_reasons_are_in_the_servers_vocabulary() -> None:
    from neffcache.server.explain.reasons import REASONS

    assert set(CLIENT_REASONS) <= set(REASONS)
    assert FAILED_BEFORE in REASONS
