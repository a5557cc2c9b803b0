"""The thundering herd: N client processes (N hosts, each with its own L1) compile one
cold graph at once through the compiler wrapper, against a real ``neffcache serve``.

Used by ``tests/client/test_herd.py`` (which asserts the counts) and
``tests/bench/bench_herd.py`` (which prints the numbers). Start-up is kept out of the
measurement: each client asks the stand-in compiler its version (remembered in its
L1), says it is ready, and blocks in ``sigwait`` until the driver signals every client
at once. Each client then runs the wrapper in-process and writes one JSON line: when
it was signalled, when it was done, its exit code.

The clients are forked by one launcher process (``herd.py --launcher``) that has
imported the client's modules, so 64 clients do not each spend the interpreter's
start and the imports (most of a cold start-up on two cores). Nothing of a client
exists before the fork: the launcher opens no connection, starts no thread (it checks
it has one thread before each fork) and reads no setting; each child starts its own
session, takes its own L1 and log, and does everything after the imports itself, so
it is a separate process the driver can signal and kill by pid. The driver is not its
parent, so it sees a client end through a pidfd.

The server is support/served.py's, with this module's lease settings.

The stand-in compiler (tests/standins/neuronx-cc) is not the real one; its compile
lasts ``NEFFCACHE_STANDIN_DELAY`` seconds and leaves a pid file while it runs.

What the server did is read from its own records, not timed: the compile leases as
its SQLite index held them (watched while the herd runs) and its lease answers by
state (``/metrics``, read before it stops).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.served import Server

TESTS = Path(__file__).resolve().parent
STANDINS = TESTS / "standins"
COMPILER = STANDINS / "neuronx-cc"
GRAPH = TESTS / "fixtures" / "hlo" / "block_a.pb"
NAMESPACE = "herd"


@dataclass(frozen=True)
class LeaseSeen:
    """One compile lease on the herd's graph as the server's index recorded it; times
    are the server's ``time.time()`` (this host's clock)."""

    lease_id: str
    holder: str
    acquired_at: float
    expires_at: float  # the latest seen: each renewal moves it on


@dataclass
class Herd:
    """What one herd run saw; times are ``time.time()`` on this host."""

    clients: int
    startup_seconds: float  # launch to all ready (not part of the herd)
    go: float  # when every client was signalled
    results: list[dict[str, Any]]  # one per finished client process
    compile_starts: list[float]  # when each compile's pid file appeared
    compile_ends: list[float]  # when each successful compile's NEFF was written
    compiles: int  # stand-in compile invocations
    server_cpu_while_waiting: float  # server CPU seconds per wall second, mid-compile
    killed_at: float | None = None
    neffs: dict[str, bytes] = field(default_factory=dict)  # output path -> bytes
    leases: list[LeaseSeen] = field(default_factory=list)  # in the order granted
    lease_answers: dict[str, int] = field(default_factory=dict)  # state -> answers


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def lease_server(root: Path, ttl: float, recheck: float | None = None) -> Server:
    """A started ``neffcache serve`` whose compile leases live ``ttl`` seconds (and whose
    waiting requests look again every ``recheck`` seconds), its data in
    ``root/server-data``, its log ``root/server.log``, in the clients' environment."""
    env = {"NEFFCACHE_LEASE_TTL_SECONDS": str(ttl)}
    if recheck is not None:
        env["NEFFCACHE_LEASE_RECHECK_SECONDS"] = str(recheck)
    server = Server(root / "server-data", env, environ=_clean_env(), log=root / "server.log")
    return server.start()


def _lease_answers(server: Server) -> dict[str, int]:
    """The server's lease answers so far, by state (``done``, ``granted``, ``held``...)."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics = server.get("/metrics")
    assert metrics.status_code == 200, metrics.text
    answers: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics.text):
        for sample in family.samples:
            if sample.name == "neffcache_lease_answers_total":
                state = sample.labels["state"]
                answers[state] = answers.get(state, 0) + int(sample.value)
    return answers


class _Client:
    """One client process the launcher forked. The driver is not its parent, so it
    cannot ``waitpid`` it: its end shows as its pidfd turning readable."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)  # the launcher reaps it only at the end: no reuse

    def exited(self) -> bool:
        return bool(select.select([self._fd], [], [], 0)[0])

    def kill(self) -> None:
        """SIGKILL it and what it started (its session), and wait until it has ended."""
        with contextlib.suppress(ProcessLookupError):  # its session has ended already
            os.killpg(self.pid, signal.SIGKILL)
        if not select.select([self._fd], [], [], 10)[0]:
            raise RuntimeError(f"client {self.pid} outlived SIGKILL")

    def close(self) -> None:
        os.close(self._fd)


class _Launcher:
    """``herd.py --launcher`` over its pipes: one client forked per ``launch``."""

    def __init__(self, env: dict[str, str], results: Path, logs: Path) -> None:
        self._results = results
        self._logs = logs
        with open(logs / "launcher.log", "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, "--launcher"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def launch(self, index: int, output: Path, l1: Path) -> _Client:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        order = [str(index), str(output), str(self._results), str(self._logs), str(l1)]
        self._process.stdin.write(json.dumps(order) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            log = (self._logs / "launcher.log").read_text()
            raise RuntimeError(f"the launcher exited: {log[-3000:]}")
        return _Client(int(answer))

    def close(self) -> None:
        """Tell it the herd is over: it reaps its (by now ended) clients and exits."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(30)
        assert self._process.stdout is not None
        self._process.stdout.close()


class _LeaseWatch:
    """The herd's compile leases as the server's SQLite index holds them, read on each
    ``look`` through a read-only connection (WAL: readers never block the server):
    cells ``lease:<namespace>:<name>`` holding ``"<lease_id> <failed> <JSON>"``
    (server/index/leases.py), or, from a server before those, rows of ``leases``.

    A lease granted over an expired one takes its row, so only a watch sees both; a
    renewal it missed leaves ``expires_at`` earlier than the truth, never later."""

    def __init__(self, index: Path, ttl: float) -> None:
        self._index = index
        self._ttl = ttl
        self._connection: sqlite3.Connection | None = None
        self._seen: dict[str, LeaseSeen] = {}  # lease id -> the latest look at it

    def look(self) -> None:
        try:
            if self._connection is None:
                uri = f"{self._index.as_uri()}?mode=ro"
                self._connection = sqlite3.connect(uri, uri=True, timeout=1)
            tables = {
                name
                for (name,) in self._connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            }
            seen: list[LeaseSeen] = []
            if "cells" in tables:
                cells = self._connection.execute(
                    "SELECT value, expires_at FROM cells WHERE key LIKE ?",
                    (f"lease:{NAMESPACE}:%",),
                )
                for value, expires_at in cells:
                    lease_id, _failed, rest = value.split(" ", 2)
                    fields = json.loads(rest)
                    seen.append(
                        LeaseSeen(lease_id, fields["holder"], fields["acquired_at"], expires_at)
                    )
            if "leases" in tables:
                rows = self._connection.execute(
                    "SELECT lease_id, holder, acquired_at, expires_at FROM leases"
                    " WHERE namespace = ?",
                    (NAMESPACE,),
                )
                seen += [LeaseSeen(*row) for row in rows]
        except sqlite3.Error:
            # Not there yet, or busy: the next look, 20 ms on, sees it.
            self.close()
            return
        for lease in seen:
            self._seen[lease.lease_id] = lease

    def granted(self) -> list[LeaseSeen]:
        return sorted(self._seen.values(), key=lambda lease: lease.acquired_at)

    def renewed(self) -> bool:
        """Whether the latest lease has been renewed: it ends later than its grant set."""
        leases = self.granted()
        return bool(leases) and leases[-1].expires_at > leases[-1].acquired_at + self._ttl

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _clean_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k in keep}


def run_herd(
    root: Path,
    *,
    clients: int = 64,
    delay: float = 10.0,
    ttl: float = 30.0,
    kill_holder_after: float | None = None,
    deadline: float = 600.0,
    client_env: dict[str, str] | None = None,
) -> Herd:
    """Run one herd in ``root``; with ``kill_holder_after``, SIGKILL the client that
    compiles (and its compiler) that many seconds after the go at the earliest, once
    its compile is running and the server has recorded a renewal of its lease, then
    start it again (a rank restarted by its job) so that every client ends with the
    NEFF."""
    root.mkdir(parents=True, exist_ok=True)
    # A waiting request then ends early only when woken (a publish, a release, the
    # holder's lease running out), never by a periodic look: the answers it counts
    # show whether the wake-ups work.
    server = lease_server(root, ttl, recheck=60.0)
    watch = _LeaseWatch(root / "server-data" / "index.db", ttl)
    pids_dir = root / "compiling"
    pids_dir.mkdir()
    counter = root / "invocations.log"
    results = root / "results.jsonl"
    env = _clean_env()
    env.update(
        PATH=f"{STANDINS}{os.pathsep}{env.get('PATH', '')}",
        NEFFCACHE_URL=f"neffcache+{server.url}/{NAMESPACE}",
        NEFFCACHE_STANDIN_DELAY=str(delay),
        NEFFCACHE_STANDIN_COUNTER=str(counter),
        NEFFCACHE_STANDIN_PIDFILE_DIR=str(pids_dir),
        NEFFCACHE_LOG="warning",
    )
    env.update(client_env or {})
    procs: list[_Client] = []
    outputs: list[Path] = []
    logs = root / "logs"
    logs.mkdir()
    launcher: _Launcher | None = None

    def launch(i: int) -> _Client:
        assert launcher is not None
        return launcher.launch(i, outputs[i], root / f"l1-{i}")

    try:
        launcher = _Launcher(env, results, logs)
        started = time.time()
        for i in range(clients):
            outputs.append(root / f"out-{i}" / "graph.neff")
            outputs[-1].parent.mkdir()
            procs.append(launch(i))
        ready = root / "ready"
        while not ready.exists() or len(list(ready.glob("*"))) < clients:
            if any(p.exited() for p in procs):
                raise RuntimeError(f"a client died during start-up: see {logs}")
            if time.time() - started > deadline:
                raise RuntimeError("the clients did not start in time")
            time.sleep(0.05)
        startup = time.time() - started
        go = time.time()
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR1)
        starts: dict[int, float] = {}
        killed_at = None
        cpu_from: tuple[float, float] | None = None
        cpu_rate = 0.0
        while not all(p.exited() for p in procs):
            watch.look()
            now = time.time()
            for pidfile in pids_dir.glob("*"):
                starts.setdefault(int(pidfile.name), now)
            # The server's CPU over the middle of the first compile: everyone but the
            # holder is waiting then.
            if cpu_from is None and now - go >= 0.3 * delay:
                cpu_from = (now, _cpu_seconds(server.pid))
            elif cpu_from is not None and not cpu_rate and now - go >= 0.8 * delay:
                used = _cpu_seconds(server.pid) - cpu_from[1]
                cpu_rate = used / (now - cpu_from[0])
            if (
                kill_holder_after is not None
                and killed_at is None
                and now - go >= kill_holder_after
            ):
                compiling = [int(p.name) for p in pids_dir.glob("*")]
                if len(compiling) > 1:
                    raise RuntimeError(f"expected one compile to kill, found {compiling}")
                if not compiling or not watch.renewed():
                    # Not started yet (64 processes starting on 2 cores), already
                    # done, or not renewed yet: the holder is killed once it compiles
                    # under a renewed lease, however long that takes the machine,
                    # never at a moment a loaded one misses.
                    time.sleep(0.02)
                    continue
                holder = _parent(compiling[0])
                index = next(i for i, p in enumerate(procs) if p.pid == holder)
                procs[index].kill()
                killed_at = time.time()
                procs[index].close()
                # The job restarts its rank: a fresh process on the same host (L1).
                (ready / str(index)).unlink()
                procs[index] = launch(index)
                _wait_ready(ready / str(index), procs[index], watch)
                os.kill(procs[index].pid, signal.SIGUSR1)
            if now - go > deadline:
                raise RuntimeError("the herd did not finish in time")
            time.sleep(0.02)
        watch.look()
        finished = [json.loads(line) for line in results.read_text().splitlines()]
        invocations = counter.read_text().splitlines() if counter.exists() else []
        compiles = sum(1 for line in invocations if "compile" in line.split()[1:])
        ends = sorted(r["compile_end"] for r in finished if r.get("compile_end") is not None)
        return Herd(
            clients=clients,
            startup_seconds=startup,
            go=go,
            results=finished,
            compile_starts=sorted(starts.values()),
            compile_ends=ends,
            compiles=compiles,
            server_cpu_while_waiting=cpu_rate,
            killed_at=killed_at,
            neffs={str(p): p.read_bytes() for p in outputs if p.exists()},
            leases=watch.granted(),
            lease_answers=_lease_answers(server),
        )
    finally:
        watch.close()
        for proc in procs:
            if not proc.exited():
                proc.kill()
            proc.close()
        if launcher is not None:
            launcher.close()
        server.kill()


def _wait_ready(marker: Path, proc: _Client, watch: _LeaseWatch) -> None:
    while not marker.exists():
        if proc.exited():
            raise RuntimeError(f"the restarted client {proc.pid} exited: see its log")
        watch.look()  # the killed holder's lease may be replaced meanwhile
        time.sleep(0.02)


# --- one client process ------------------------------------------------------------------


def _client(index: str, output: str, results: str) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    from neffcache.client import lease
    from neffcache.client.compiler import compiler_version, find_real_compiler

    # Each client plays one host: its lease holder names its own host, so the others
    # cannot see its process die (as on a real fleet) and wait for its lease to end.
    lease.holder_name = lambda: f"herd-host-{index} pid {os.getpid()}"
    from neffcache.client.stats import STATS
    from neffcache.client.wrapper import main as wrap

    real = find_real_compiler("neuronx-cc", None, os.environ["PATH"])
    assert real is not None
    compiler_version(real, Path(os.environ["NEFFCACHE_LOCAL_DIR"]))  # remembered in L1
    ready = Path(results).parent / "ready"
    ready.mkdir(exist_ok=True)
    (ready / index).write_text(str(os.getpid()))
    signal.sigwait({signal.SIGUSR1})
    go = time.time()
    argv = ["neuronx-cc", "compile", "--framework=XLA", "--target=trn1", str(GRAPH)]
    argv += ["--output", output, "--model-type=transformer"]
    code = wrap(argv)
    compiled = STATS.snapshot().get("compiles", 0) > 0
    line = {
        "client": int(index),
        "pid": os.getpid(),
        "go": go,
        "done": time.time(),
        "code": code,
        # The stand-in writes its NEFF last thing before it exits.
        "compile_end": os.stat(output).st_mtime if compiled else None,
        "events": STATS.snapshot(),
    }
    fd = os.open(results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (json.dumps(line) + "\n").encode())
    os.close(fd)
    return code


def _launcher() -> int:
    """Fork one client per line on stdin (``[index, output, results, logs, l1]`` in
    JSON), answering its pid; at the end of stdin, reap them all and exit."""
    # What a client imports before it is ready (``_client``), loaded once for all.
    from neffcache.client import lease  # noqa: F401
    from neffcache.client.compiler import compiler_version  # noqa: F401
    from neffcache.client.stats import STATS  # noqa: F401
    from neffcache.client.wrapper import main  # noqa: F401

    for line in sys.stdin:
        index, output, results, logs, l1 = json.loads(line)
        # A thread would not survive the fork, and whatever it held would stay held.
        assert threading.active_count() == 1, threading.enumerate()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _forked(index, output, results, Path(logs) / f"client-{index}.log", l1)
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return 0


def _forked(index: str, output: str, results: str, log: Path, l1: str) -> None:
    """In a forked child: become a client process of its own, then run it; never returns."""
    code = 1
    try:
        os.setsid()  # its own session: the driver kills it and its compiler together
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ["NEFFCACHE_LOCAL_DIR"] = l1
        code = _client(index, output, results)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--launcher"]:
        sys.exit(_launcher())
    raise SystemExit("usage: herd.py --launcher (started by run_herd)")
