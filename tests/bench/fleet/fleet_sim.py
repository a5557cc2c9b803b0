"""The fleet simulation's driver: N hosts by M ranks, each rank a real process
(fleet_rank.py) replaying the job's graph sequence (fleet_graphs.py) through the
stand-in ``libneuronxla`` and the stand-in compiler (via the per-graph wrapper
``neuronx-cc`` in this directory), against one cache configuration at a time:

* ``none``: no cache (``NEURON_CC_FLAGS=--no_cache``): every rank compiles every graph.
* ``local``: the stock cache in a directory per host, shared by that host's ranks.
* ``s3``: the stock cache on one S3 prefix (the stand-in of fleet_s3.py, against
  moto's server).
* ``neffcache``: a real ``neffcache serve``; the client's hook in every rank, with a
  per-host L1 (``NEFFCACHE_LOCAL_DIR``).
* ``shared``: the stock cache in one directory shared by every host (as on NFS or
  EFS), here on one local filesystem, so its locks work as they would not on NFS
  (docs/neuron-sdk.md#network-filesystems): the peer's best case.

Each configuration runs three phases: ``cold`` (empty caches), ``warm`` (the same
hosts again: their directories and L1s kept) and ``new hosts`` (the job again on
hosts with empty local state, against the shared cache the first two filled).

Used by tests/bench/bench_fleet.py (which prints the figures) and
tests/fleet/test_fleet.py (which asserts the counts). Everything listens on
127.0.0.1; everything started is stopped, and the work directory removed, on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
TESTS = BENCH.parent
for _path in (HERE, BENCH, TESTS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_server as peers  # noqa: E402  (neffcache_server, Service)
from bench_load import AWS_ENV, fresh_bucket, moto_service  # noqa: E402
from fleet_graphs import Graph, write_table  # noqa: E402
from fleet_relay import Moved, Relay  # noqa: E402
from support.e2e import clean_environ, search_path  # noqa: E402

STANDINS = TESTS / "standins"
RANK = HERE / "fleet_rank.py"
NAMESPACE = "fleet"

CONFIGS = {
    "none": "(a) no cache",
    "local": "(b) stock local dir per host",
    "s3": "(c) stock S3 prefix (stand-in)",
    "neffcache": "(d) neffcache",
    "shared": "(e) stock shared dir (NFS/EFS)",
}
PHASES = ("cold", "warm", "new hosts")


@dataclass(frozen=True)
class Plan:
    hosts: int
    ranks: int
    graphs: list[Graph]
    scale: float
    seed: int = 0
    configs: tuple[str, ...] = tuple(CONFIGS)
    phases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # config -> phases

    def phases_of(self, config: str) -> tuple[str, ...]:
        return self.phases.get(config, PHASES)

    @property
    def chain_seconds(self) -> float:
        """One rank compiling the whole sequence, scaled."""
        return sum(g.scaled_seconds(self.scale) for g in self.graphs)


@dataclass(frozen=True)
class Compile:
    """One stand-in compile, from the wrapper's log; ``seconds`` is its scaled sleep."""

    graph: str
    host: str
    pid: int  # the rank process whose SDK ran it
    end: float
    seconds: float
    code: int


@dataclass
class PhaseResult:
    config: str
    phase: str
    plan: Plan
    compiles: list[Compile]
    ranks: list[dict[str, Any]]
    moved: Moved  # bytes over the network: up to the cache, down from it
    moved_how: str  # "wire" (relay), "file payload" (shared dir) or "none"
    io: Counter[str]  # the stock cache's file operations, summed over ranks
    outcomes: Counter[str]  # neffcache run-manifest lines by result/source
    errors: list[str]

    def compiles_per_graph(self) -> Counter[str]:
        return Counter(c.graph for c in self.compiles)

    def compiles_per_host_graph(self) -> Counter[tuple[str, str]]:
        return Counter((c.host, c.graph) for c in self.compiles)

    @property
    def compile_hours(self) -> float:
        """Modelled compile-hours: each compile counts its graph's modelled time."""
        by_name = {g.fixture: g for g in self.plan.graphs}
        return sum(by_name[c.graph].modelled_seconds for c in self.compiles) / 3600

    @property
    def ttfs_measured(self) -> float | None:
        """Seconds from the go to the slowest rank holding its last graph."""
        ends = [r["graphs"][-1]["t"] - r["go"] for r in self._complete()]
        return max(ends) if ends and len(ends) == len(self.ranks) else None

    @property
    def ttfs_modelled(self) -> float | None:
        """The same in modelled seconds: see :func:`modelled_seconds`."""
        times = [modelled_seconds(r, self.compiles, self.plan.scale) for r in self._complete()]
        return max(times) if times and len(times) == len(self.ranks) else None

    def _complete(self) -> list[dict[str, Any]]:
        count = len(self.plan.graphs)
        return [r for r in self.ranks if r.get("code") == 0 and len(r["graphs"]) == count]


def _covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` within ``[start, end]``."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def waited_for(
    rank: dict[str, Any], graph: str, compiles: list[Compile], start: float, end: float
) -> Compile | None:
    """The compile whose result the rank got for ``graph`` in ``[start, end]``: its own;
    else the last one that ended in that window on its host (a waiter on the host's
    lock); else the last one that ended in it on any host (a waiter on a shared
    directory's lock or on neffcache's lease). None when it waited for no compile."""
    mine = [c for c in compiles if c.graph == graph and c.pid == rank["pid"]]
    within = [c for c in compiles if c.graph == graph and start < c.end <= end]
    pool = mine or [c for c in within if c.host == rank["host"]] or within
    return max(pool, key=lambda c: c.end, default=None)


def modelled_seconds(rank: dict[str, Any], compiles: list[Compile], scale: float) -> float:
    """A rank's time to its last graph, in modelled seconds.

    For each graph, the rank's wait for it (from the previous graph, or the go, to the
    time train_like printed it) is split in two: the seconds during which the compile
    it got the graph from (:func:`waited_for`) was sleeping stand for compile time and
    count ``1 / scale`` times; every other second (the compiler's process start,
    lookups, transfers, lock polls) is real work of this run and counts once. A
    compile's sleep is taken as the last ``seconds`` before the wrapper logged its end
    (after sleeping, the stand-in writes the second half of its NEFF and renames it:
    milliseconds).
    """
    total, previous = 0.0, rank["go"]
    for graph in rank["graphs"]:
        source = waited_for(rank, graph["name"], compiles, previous, graph["t"])
        covered = 0.0
        if source is not None:
            sleep = (source.end - source.seconds, source.end)
            covered = _covered([sleep], previous, graph["t"])
        total += graph["t"] - previous + covered * (1 / scale - 1)
        previous = graph["t"]
    return total


# --- the fleet --------------------------------------------------------------------------


class Fleet:
    """Services and a work directory for a plan; :meth:`run` runs one configuration."""

    def __init__(self, plan: Plan, workdir: Path | None = None) -> None:
        self.plan = plan
        self._stack = contextlib.ExitStack()
        self._workdir = workdir
        self.root = Path()
        self.table = Path()
        self.server_relay: Relay | None = None
        self.s3_relay: Relay | None = None
        self.bucket_url = ""

    def __enter__(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _start(self) -> None:
        if self._workdir is None:
            self.root = Path(tempfile.mkdtemp(prefix="neffcache-fleet-"))
            self._stack.callback(shutil.rmtree, self.root, ignore_errors=True)
        else:
            self.root = self._workdir
            self.root.mkdir(parents=True, exist_ok=True)
        self.table = self.root / "graphs.json"
        write_table(self.plan.graphs, self.plan.scale, self.table)
        # Both services before any relay thread: they fork with a preexec_fn.
        server = moto = None
        if "neffcache" in self.plan.configs:
            server = self._stack.enter_context(peers.neffcache_server(self.root))
        if "s3" in self.plan.configs:
            moto = self._stack.enter_context(moto_service(self.root))
            self.bucket_url = fresh_bucket(moto)
        if server is not None:
            self.server_relay = self._stack.enter_context(Relay(_port(server.url)))
        if moto is not None:
            self.s3_relay = self._stack.enter_context(Relay(_port(moto.url)))

    def run(self, config: str) -> list[PhaseResult]:
        base = self.root / config
        results = []
        for phase in self.plan.phases_of(config):
            hosts = base / ("hosts-new" if phase == "new hosts" else "hosts")
            suffix = "n" if phase == "new hosts" else ""
            names = [f"{config}-host{h}{suffix}" for h in range(self.plan.hosts)]
            phase_dir = base / phase.replace(" ", "-")
            results.append(self._phase(config, phase, names, hosts, phase_dir))
        return results

    # -- one phase -----------------------------------------------------------------------

    def _phase(
        self, config: str, phase: str, names: list[str], hosts: Path, phase_dir: Path
    ) -> PhaseResult:
        phase_dir.mkdir(parents=True)
        (phase_dir / "ready").mkdir()
        relay = {"neffcache": self.server_relay, "s3": self.s3_relay}.get(config)
        before = relay.snapshot() if relay else Moved()
        ranks, errors = self._launch_and_wait(config, names, hosts, phase_dir)
        moved = (relay.snapshot() - before) if relay else Moved()
        compiles = _read_compiles(phase_dir / "compiles.jsonl")
        io: Counter[str] = Counter()
        for rank in ranks:
            io.update(rank.get("io", {}))
        how = "wire" if relay else "none"
        if config == "s3":  # bodies boto3 resent after moto's 500s (see fleet_s3.RETRIES)
            moved = Moved(moved.up - io["retried_bytes"], moved.down)
        if config == "shared":
            moved, how = Moved(io["written_bytes"], io["read_bytes"]), "file payload"
        errors += [f"compile of {c.graph} on {c.host} exited {c.code}" for c in compiles if c.code]
        errors += _check_neffs(phase_dir / "out", self.plan.graphs)
        shutil.rmtree(phase_dir / "out", ignore_errors=True)
        outcomes = _read_outcomes(phase_dir / "manifest.jsonl")
        return PhaseResult(
            config, phase, self.plan, compiles, ranks, moved, how, io, outcomes, errors
        )

    def _launch_and_wait(
        self, config: str, names: list[str], hosts: Path, phase_dir: Path
    ) -> tuple[list[dict[str, Any]], list[str]]:
        slots = [(name, r) for name in names for r in range(self.plan.ranks)]
        random.Random(f"{self.plan.seed} {config} {phase_dir.name}").shuffle(slots)
        procs: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        try:
            for name, r in slots:
                procs.append(self._start_rank(config, name, r, hosts / name, phase_dir))
            self._wait_ready(procs, phase_dir / "ready")
            for _, _, proc in procs:  # the go: every rank at once, in launch order
                os.kill(proc.pid, signal.SIGUSR1)
            return self._collect(procs)
        finally:
            for _, _, proc in procs:
                _kill_group(proc)

    def _start_rank(
        self, config: str, host: str, rank: int, host_dir: Path, phase_dir: Path
    ) -> tuple[str, Path, subprocess.Popen[bytes]]:
        for sub in ("l1", "tmp", "neuron-cache"):
            (host_dir / sub).mkdir(parents=True, exist_ok=True)
        label = f"{host}-rank{rank}"
        out = phase_dir / "out" / label
        out.mkdir(parents=True)
        results = phase_dir / f"{label}.json"
        argv = [sys.executable, str(RANK), str(results), str(out)]
        argv += [str(g.path) for g in self.plan.graphs]
        logs = phase_dir / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{label}.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                env=self._env(config, host, host_dir, phase_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return label, results, proc

    def _env(self, config: str, host: str, host_dir: Path, phase_dir: Path) -> dict[str, str]:
        env = clean_environ()
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            env.pop(name, None)
        env.update(
            PATH=search_path(HERE),
            PYTHONPATH=str(STANDINS),
            TMPDIR=str(host_dir / "tmp"),
            NEFFCACHE_LOCAL_DIR=str(host_dir / "l1"),
            NEFFCACHE_STANDIN_LOCK_TIMEOUT=str(self.deadline),
            FLEET_MODE=config,
            FLEET_HOST=host,
            FLEET_READY=str(phase_dir / "ready"),
            FLEET_GRAPH_TABLE=str(self.table),
            FLEET_COMPILE_LOG=str(phase_dir / "compiles.jsonl"),
        )
        env.update(self._cache_env(config, host_dir, phase_dir))
        return env

    def _cache_env(self, config: str, host_dir: Path, phase_dir: Path) -> dict[str, str]:
        if config == "none":
            return {"NEURON_CC_FLAGS": "--no_cache"}
        if config == "local":
            return {"NEURON_COMPILE_CACHE_URL": str(host_dir / "neuron-cache")}
        if config == "shared":
            shared = self.root / "shared" / "neuron-cache"
            shared.mkdir(parents=True, exist_ok=True)
            return {"NEURON_COMPILE_CACHE_URL": str(shared)}
        if config == "s3":
            assert self.s3_relay is not None
            env = {"NEURON_COMPILE_CACHE_URL": self.bucket_url}
            return env | AWS_ENV | {"FLEET_S3_ENDPOINT": self.s3_relay.url}
        if config == "neffcache":
            assert self.server_relay is not None
            return {
                "NEURON_COMPILE_CACHE_URL": f"neffcache+{self.server_relay.url}/{NAMESPACE}",
                "NEFFCACHE_RUN_MANIFEST": str(phase_dir / "manifest.jsonl"),
                "NEFFCACHE_LOG": "warning",
            }
        raise ValueError(f"unknown configuration {config!r}")

    @property
    def deadline(self) -> float:
        """Seconds a phase may take: every rank compiling everything, with room."""
        return 120 + 5 * self.plan.chain_seconds

    def _wait_ready(
        self, procs: list[tuple[str, Path, subprocess.Popen[bytes]]], ready: Path
    ) -> None:
        until = time.monotonic() + 120
        while len(list(ready.iterdir())) < len(procs):
            dead = [label for label, _, p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"ranks died during start-up: {dead} (logs in {ready.parent})")
            if time.monotonic() > until:
                raise RuntimeError("the ranks did not start within 120 s")
            time.sleep(0.02)

    def _collect(
        self, procs: list[tuple[str, Path, subprocess.Popen[bytes]]]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        until = time.monotonic() + self.deadline
        ranks: list[dict[str, Any]] = []
        errors: list[str] = []
        for label, results, proc in procs:
            try:
                code = proc.wait(timeout=max(1.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                errors.append(f"{label} did not finish within {self.deadline:.0f} s")
                ranks.append({"label": label, "code": None, "graphs": []})
                continue
            if results.exists():
                ranks.append({"label": label, **json.loads(results.read_text())})
            else:
                ranks.append({"label": label, "code": code, "graphs": []})
            if code != 0:
                errors.append(f"{label} exited {code}")
        return ranks, errors


# --- reading what the ranks left ------------------------------------------------------


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _read_compiles(path: Path) -> list[Compile]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [
        Compile(d["graph"], d["host"], d["pid"], d["end"], d["seconds"], d["code"]) for d in lines
    ]


def _read_outcomes(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    found: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        record = json.loads(line)
        found[record["source"] if record["result"] == "hit" else "compiled"] += 1
    return found


def _check_neffs(out: Path, graphs: list[Graph]) -> list[str]:
    """Every rank must hold, for each graph, the same bytes as every other rank."""
    errors = []
    for index, graph in enumerate(graphs):
        files = list(out.glob(f"*/{index}-{graph.fixture}.neff"))
        blobs = [f.read_bytes() for f in files]
        if len({hashlib.sha256(b).hexdigest() for b in blobs}) > 1:
            errors.append(f"{graph.fixture}: the ranks hold different NEFFs")
        if any(len(b) != graph.neff_bytes for b in blobs):
            errors.append(f"{graph.fixture}: a NEFF is not {graph.neff_bytes} bytes")
    return errors
