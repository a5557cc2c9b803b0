"""Fleet simulation: N hosts by M ranks replay a training job's graph
sequence, cold then warm, against no cache, the stock Neuron cache (a directory per
host, an S3 prefix, one directory shared by every host) and neffcache.

    python tests/bench/bench_fleet.py [--quick] [--hosts 4] [--ranks 4] [--graphs 10]
                                      [--scale 1/600] [--seed 0] [--only CONFIG ...]

Every rank is a real process running the training-like caller
(tests/client/train_like.py) through the stand-in ``libneuronxla`` and the stand-in
compiler (tests/standins/; not AWS's code), with the cache its environment names:

* (a) no cache: ``NEURON_CC_FLAGS=--no_cache``, every rank compiles every graph;
* (b) the stock cache in a directory per host, shared by the host's ranks;
* (c) the stock cache on one S3 prefix, against moto's S3 server: a stand-in of the
  S3 backend written from docs/neuron-sdk.md (tests/bench/fleet/fleet_s3.py; no locks);
* (d) neffcache: a real ``neffcache serve`` on 127.0.0.1, the client's hook in every
  rank (``NEURON_COMPILE_CACHE_URL=neffcache+http://...``), an L1 directory per host;
* (e) the stock cache in one directory shared by every host, as on NFS or EFS: the
  peer a fleet without neffcache uses. Here it is one local filesystem, where its locks
  work; on NFS they do not (docs/neuron-sdk.md#network-filesystems), so this is the
  peer's best case.

Each runs three phases: cold (empty caches), warm (the same hosts again) and new
hosts (the job again on hosts with empty local state, against what the first two
left in the shared cache). Compile times are modelled (tests/bench/fleet/
fleet_graphs.py: minutes per graph) and run scaled: a graph modelled at ``m``
seconds sleeps ``m x scale`` in the stand-in compiler.

Printed per configuration and phase: compiles (per graph and per host), modelled
compile-hours, time to first step (measured, and converted to modelled time), and the
bytes moved over the network. Peers are measured in the same run. No assertions: the
counts are asserted by tests/fleet/test_fleet.py.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "fleet"))
from bench_server import until_interrupted
from fleet_graphs import CATALOGUE, sequence
from fleet_sim import CONFIGS, Fleet, PhaseResult, Plan
from results import record

MiB = 2**20
QUICK = {"hosts": 2, "ranks": 2, "graphs": 5, "scale": "1/1200"}


# --- formatting -------------------------------------------------------------------------


def size(n: int) -> str:
    if n < 10 * 1024:
        return f"{n} B"
    if n < MiB:
        return f"{n / 1024:.0f} KiB"
    return f"{n / MiB:.1f} MiB"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def modelled(value: float | None) -> str:
    """Modelled seconds as minutes (or seconds, when under a minute)."""
    if value is None:
        return "-"
    return f"{value / 60:.1f} min" if value >= 60 else f"{value:.1f} s"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a / b:.3g}x" if b else ("1x" if not a else "inf")


# --- the report -------------------------------------------------------------------------


def header(plan: Plan) -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; neffcache {importlib.metadata.version('neffcache')}"
    )
    chain = sum(g.modelled_minutes for g in plan.graphs)
    scale = Fraction(plan.scale).limit_denominator(100_000)
    print(
        f"fleet: {plan.hosts} hosts x {plan.ranks} ranks = {plan.hosts * plan.ranks} ranks; "
        f"{len(plan.graphs)} graphs, {chain:.0f} modelled compile-minutes per sequence; "
        f"scale {scale} (a 10-minute compile sleeps {600 * plan.scale:.2f} s); seed {plan.seed}"
    )
    print("graph sequence (distinct programs; modelled compile time, NEFF size):")
    for i, g in enumerate(plan.graphs, 1):
        minutes = f"{g.modelled_minutes:5.0f} min"
        print(f"  {i:2d}. {g.fixture:<22} {g.role:<36} {minutes}  {size(g.neff_bytes)}")
    print(flush=True)


COLUMNS = (
    f"    {'phase':<10}{'compiles':>9}{'/graph':>8}{'max/host/graph':>15}{'compile-h':>11}"
    f"{'TTFS meas.':>12}{'TTFS model':>12}{'bytes up':>11}{'bytes down':>12}"
)


def row(r: PhaseResult) -> str:
    per_graph = len(r.compiles) / len(r.plan.graphs)
    per_host = max(r.compiles_per_host_graph().values(), default=0)
    return (
        f"    {r.phase:<10}{len(r.compiles):>9}{per_graph:>8.1f}{per_host:>15}"
        f"{r.compile_hours:>11.2f}{seconds(r.ttfs_measured):>12}{modelled(r.ttfs_modelled):>12}"
        f"{size(r.moved.up):>11}{size(r.moved.down):>12}"
    )


def detail(config: str, results: list[PhaseResult]) -> list[str]:
    """What each phase did with the cache, beyond the table."""
    lines = []
    for r in results:
        io = r.io
        if config == "s3":
            puts = io["upload_file"] + io["upload_string_to_file"]
            retried = (
                f"; boto3 retries {io['retries']}, their {size(io['retried_bytes'])} of bodies "
                "not counted (moto's 500s on concurrent PutObjects of one key)"
                if io["retries"]
                else ""
            )
            lines.append(
                f"{r.phase}: S3 requests HeadObject {io['exists']}, GetObject "
                f"{io['download_file']}, PutObject {puts} (payload "
                f"{size(io['written_bytes'])} up, {size(io['read_bytes'])} down){retried}"
            )
        elif config in ("local", "shared"):
            where = "on each host's disk" if config == "local" else "on the shared directory"
            lines.append(
                f"{r.phase}: {io['exists']} probes, {io['download_file']} reads "
                f"({size(io['read_bytes'])}), {io['upload_file'] + io['upload_string_to_file']}"
                f" writes ({size(io['written_bytes'])}) {where}"
            )
    return lines


def report(config: str, results: list[PhaseResult]) -> None:
    print(CONFIGS[config])
    print(COLUMNS)
    for r in results:
        print(row(r))
    how = results[0].moved_how
    if how == "wire":
        print("    bytes: every byte on the wire to and from the cache (a counting relay)")
    elif how == "file payload":
        print("    bytes: file contents read and written on the shared directory (NFS adds more)")
    for line in detail(config, results):
        print(f"    {line}")
    for r in results:
        for error in r.errors:
            print(f"    ERROR ({r.phase}): {error}")
    print(flush=True)


def _cells(r: PhaseResult | None, *, warm: bool = False) -> tuple[str, str, str]:
    """Compile-hours, time to first step (measured when warm) and bytes of a phase."""
    if r is None:
        return "-", "-", "-"
    ttfs = seconds(r.ttfs_measured) if warm else modelled(r.ttfs_modelled)
    return f"{r.compile_hours:.2f}", ttfs, size(r.moved.total)


def summary(runs: dict[str, list[PhaseResult]]) -> None:
    print("SUMMARY (compile-hours modelled; TTFS modelled, warm measured; bytes up + down)")
    head = (
        f"{'configuration':<34}{'cold c-h':>9}{'cold TTFS':>11}{'warm TTFS':>11}"
        f"{'new c-h':>9}{'new TTFS':>11}{'bytes cold':>12}{'warm':>11}{'new':>11}"
    )
    print(head)
    print("-" * len(head))
    for config in runs:
        cold_h, cold_t, cold_b = _cells(phase(runs, config, "cold"))
        _, warm_t, warm_b = _cells(phase(runs, config, "warm"), warm=True)
        new_h, new_t, new_b = _cells(phase(runs, config, "new hosts"))
        print(
            f"{CONFIGS[config]:<34}{cold_h:>9}{cold_t:>11}{warm_t:>11}{new_h:>9}{new_t:>11}"
            f"{cold_b:>12}{warm_b:>11}{new_b:>11}"
        )
    print()


def phase(runs: dict[str, list[PhaseResult]], config: str, name: str) -> PhaseResult | None:
    return next((r for r in runs.get(config, []) if r.phase == name), None)


def _hours(r: PhaseResult) -> float | None:
    return r.compile_hours


def _ttfs_minutes(r: PhaseResult) -> float | None:
    return None if r.ttfs_modelled is None else r.ttfs_modelled / 60


def _ttfs_seconds(r: PhaseResult) -> float | None:
    return r.ttfs_measured


def _mib(r: PhaseResult) -> float | None:
    return r.moved.total / MiB


PEERS = {
    "none": "compile every time",
    "local": "stock local dir per host",
    "s3": "stock S3 prefix",
    "shared": "stock shared directory",
}
# (figure, phase, what of it, unit, peer configuration): neffcache's value and the
# peer's, from the same phase of the same run.
FIGURES: tuple[tuple[str, str, Callable[[PhaseResult], float | None], str, str], ...] = (
    ("cold compile-hours", "cold", _hours, "modelled h", "none"),
    ("cold compile-hours", "cold", _hours, "modelled h", "shared"),
    ("cold compile-hours", "cold", _hours, "modelled h", "local"),
    ("cold compile-hours", "cold", _hours, "modelled h", "s3"),
    ("cold time to first step", "cold", _ttfs_minutes, "modelled min", "local"),
    ("new-hosts time to first step", "new hosts", _ttfs_minutes, "modelled min", "local"),
    ("warm time to first step", "warm", _ttfs_seconds, "s", "local"),
    ("warm bytes moved", "warm", _mib, "MiB", "s3"),
    ("new-hosts bytes moved", "new hosts", _mib, "MiB", "s3"),
)


def headlines(runs: dict[str, list[PhaseResult]]) -> None:
    """Print neffcache's ratios to its peers and record them for run_all.py."""
    print("neffcache / peer (lower is better for every figure):")
    for figure, name, value, unit, peer in FIGURES:
        ours, theirs = phase(runs, "neffcache", name), phase(runs, peer, name)
        a = None if ours is None else value(ours)
        b = None if theirs is None else value(theirs)
        if a is None or b is None:
            continue
        print(f"  {figure:<28} {a:10.3f} vs {b:10.3f} {unit:<13} {PEERS[peer]:<26} {ratio(a, b)}")
        record("fleet", figure, a, PEERS[peer], b, unit, better="lower", note=NOTE)
    print()


NOTE = "stand-in compiler and libneuronxla; compile times modelled and scaled"


def closing(plan: Plan) -> None:
    print("What is modelled and what is measured:")
    print(
        "  modelled: each graph's compile time (fleet_graphs.py) and NEFF size; the stand-in "
        "compile sleeps modelled x scale. compile-hours = compiles x modelled time."
    )
    print(
        "  measured: compiles (the compiler wrapper's log: every stand-in compile that ran), "
        "the ranks' times, bytes (a counting TCP relay in front of neffcache and moto: HTTP "
        "headers, lookups, leases and telemetry included; for the shared directory, the "
        "file contents read and written)."
    )
    print(
        "  TTFS (time to first step): from the go (every rank signalled at once, after "
        "process start-up and imports) to the slowest rank holding its last graph. "
        "Modelled: per rank and graph, the seconds the compile it got the graph from (its "
        "own, or the lock or lease holder's) was sleeping count 1/scale times, every other "
        "second once; the slowest rank's total."
    )
    print(
        "  not modelled: S3 throttling and latency (moto on loopback), NFS locking errors "
        "(the shared directory is local here), network bandwidth, CPU contention of real "
        f"compiles ({os.cpu_count()} cores here run {plan.hosts * plan.ranks} ranks)."
    )


# --- main -------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> Plan:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 hosts x 2 ranks, 5 graphs, 1/1200")
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--graphs", type=int, help=f"1 to {len(CATALOGUE)}")
    parser.add_argument("--scale", help="measured seconds per modelled second, e.g. 1/600")
    parser.add_argument("--seed", type=int, default=0, help="the ranks' launch order")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else {"hosts": 4, "ranks": 4, "graphs": 10, "scale": "1/600"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    scale = float(Fraction(args.scale))
    if args.hosts < 1 or args.ranks < 1 or not 0 < scale <= 1:
        parser.error("--hosts and --ranks must be at least 1, --scale in (0, 1]")
    try:
        graphs = sequence(args.graphs)
    except ValueError as exc:
        parser.error(str(exc))
    configs = tuple(c for c in CONFIGS if c in args.only)
    return Plan(args.hosts, args.ranks, graphs, scale, args.seed, configs)


def run(plan: Plan) -> int:
    header(plan)
    started = time.monotonic()
    runs: dict[str, list[PhaseResult]] = {}
    with Fleet(plan) as fleet:
        for config in plan.configs:
            print(f"running {CONFIGS[config]} ...", flush=True)
            runs[config] = fleet.run(config)
            report(config, runs[config])
    summary(runs)
    headlines(runs)
    closing(plan)
    errors = sum(len(r.errors) for results in runs.values() for r in results)
    print(f"\ntotal {time.monotonic() - started:.0f} s; errors: {errors}; processes stopped")
    return 1 if errors else 0


def main() -> None:
    plan = parse()
    until_interrupted(lambda: run(plan))


if __name__ == "__main__":
    main()
