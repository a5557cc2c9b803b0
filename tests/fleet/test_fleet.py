"""The fleet simulation's moving parts (tests/bench/fleet/, run by
tests/bench/bench_fleet.py): a small fleet (2 hosts x 2 ranks, 2 graphs, compiles of a
fraction of a second) through every configuration, and the counts that must hold
whatever the timing: who compiled what, and what crossed the network. Never timing.

The configurations run at once, each in a thread (their phases in order): each has
its own directories, services and relay, and the counts do not depend on timing. The
S3 stand-in's endpoint is the session's moto server (``s3_endpoint``), not one more.

Also the pure parts: the interval arithmetic behind the modelled time to first step.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "fleet"))
import fleet_graphs
import fleet_sim
from fleet_sim import Compile, Fleet, PhaseResult, Plan

HOSTS, RANKS = 2, 2
GRAPHS = fleet_graphs.sequence(2)  # 45 and 3 modelled minutes
SCALE = 1 / 5400  # 0.5 s and 0.03 s
PLAN = Plan(
    HOSTS,
    RANKS,
    GRAPHS,
    SCALE,
    phases={"none": ("cold", "warm"), "s3": ("cold", "warm"), "shared": ("cold", "warm")},
)
NAMES = [g.fixture for g in GRAPHS]


def run_fleet() -> dict[str, dict[str, PhaseResult]]:
    with Fleet(PLAN) as fleet, ThreadPoolExecutor(len(PLAN.configs)) as pool:
        runs = dict(zip(PLAN.configs, pool.map(fleet.run, PLAN.configs), strict=True))
    return {c: {r.phase: r for r in results} for c, results in runs.items()}


@pytest.fixture
def session_moto(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's S3 stand-in against the session's moto (buckets are fresh per
    fleet), instead of a moto server of its own: starting one costs seconds of CPU."""

    @contextlib.contextmanager
    def running(_root: Path) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(url=s3_endpoint)  # what the fleet reads of its service

    monkeypatch.setattr(fleet_sim, "moto_service", running)


def hosts_of(result: PhaseResult) -> set[str]:
    return {r["host"] for r in result.ranks}


@pytest.mark.usefixtures("session_moto")
def test_fleet_counts() -> None:
    """One fleet run (one test, so that pytest-xdist never runs it twice), every count."""
    runs = run_fleet()
    check_every_rank_got_every_graph(runs)
    check_no_cache(runs["none"])
    check_stock_local(runs["local"])
    check_neffcache(runs["neffcache"])
    check_stock_shared_directory(runs["shared"])
    check_stock_s3(runs["s3"])
    minutes = sum(g.modelled_minutes for g in GRAPHS)
    assert runs["neffcache"]["cold"].compile_hours == pytest.approx(minutes / 60)
    assert runs["none"]["cold"].compile_hours == pytest.approx(HOSTS * RANKS * minutes / 60)


def check_every_rank_got_every_graph(runs: dict[str, dict[str, PhaseResult]]) -> None:
    for config, phases in runs.items():
        assert set(phases) == set(PLAN.phases_of(config))
        for name, result in phases.items():
            assert not result.errors, (config, name, result.errors)
            assert len(result.ranks) == HOSTS * RANKS
            for rank in result.ranks:
                assert [g["name"] for g in rank["graphs"]] == NAMES, (config, name, rank)


def check_no_cache(phases: dict[str, PhaseResult]) -> None:
    """Every rank compiles every graph, every time."""
    for result in phases.values():
        assert result.compiles_per_graph() == {n: HOSTS * RANKS for n in NAMES}
        assert result.moved.total == 0


def check_stock_local(phases: dict[str, PhaseResult]) -> None:
    """Once per graph per host (the host's ranks wait on its lock), not again on the
    same host, once more on every new host."""
    for name in ("cold", "new hosts"):
        result = phases[name]
        expected = {(h, g): 1 for h in hosts_of(result) for g in NAMES}
        assert result.compiles_per_host_graph() == expected, name
    assert phases["warm"].compiles == []


def check_neffcache(phases: dict[str, PhaseResult]) -> None:
    """Once per graph fleet-wide, then never: warm hosts read their L1 (no NEFF crosses
    the network), new hosts fetch each graph once per host."""
    assert phases["cold"].compiles_per_graph() == {n: 1 for n in NAMES}
    assert phases["warm"].compiles == []
    assert phases["new hosts"].compiles == []
    smallest = min(g.neff_bytes for g in GRAPHS)
    assert phases["warm"].moved.down < smallest
    one_sequence = sum(g.neff_bytes for g in GRAPHS)
    assert HOSTS * one_sequence <= phases["new hosts"].moved.down < (HOSTS + 1) * one_sequence
    # Cold: every host but the compiling one fetches each graph once, however many of
    # its ranks asked (a second fetch would add at least the smallest NEFF).
    cold = phases["cold"].moved.down
    assert (HOSTS - 1) * one_sequence <= cold < (HOSTS - 1) * one_sequence + smallest
    for name, result in phases.items():  # one run-manifest line per rank and graph
        assert sum(result.outcomes.values()) == HOSTS * RANKS * len(NAMES), name
        assert result.outcomes["compiled"] == len(result.compiles), name


def check_stock_shared_directory(phases: dict[str, PhaseResult]) -> None:
    """One directory, one lock for every host: once per graph fleet-wide."""
    assert phases["cold"].compiles_per_graph() == {n: 1 for n in NAMES}
    assert phases["warm"].compiles == []


def check_stock_s3(phases: dict[str, PhaseResult]) -> None:
    """No lock: a rank compiles whatever it finds missing (at least one compile per
    graph, at most one per rank); warm, every rank downloads every NEFF."""
    cold = phases["cold"].compiles_per_graph()
    assert set(cold) == set(NAMES)
    assert all(1 <= count <= HOSTS * RANKS for count in cold.values())
    assert phases["warm"].compiles == []
    assert phases["warm"].moved.down >= HOSTS * RANKS * sum(g.neff_bytes for g in GRAPHS)


# --- the modelled time to first step -----------------------------------------------------


def test_covered_is_the_union_within_the_window() -> None:
    covered = fleet_sim._covered
    assert covered([(1, 3), (2, 5), (7, 8)], 0, 10) == 5
    assert covered([(1, 3), (2, 5)], 2.5, 4) == 1.5
    assert covered([(5, 6)], 0, 4) == 0


def test_modelled_seconds_stretch_only_the_compile_the_rank_waited_for() -> None:
    scale = 0.01
    rank = {"pid": 1, "host": "h0", "go": 0.0}
    rank["graphs"] = [{"name": "a", "t": 2.0}, {"name": "b", "t": 2.5}]
    compiles = [
        Compile("a", "h0", 1, end=1.9, seconds=1.0, code=0),  # its own compile
        Compile("a", "h1", 9, end=1.8, seconds=1.0, code=0),  # another host's: ignored
        Compile("b", "h1", 9, end=2.4, seconds=0.2, code=0),  # the lease holder's
    ]
    # 2.0 s for "a", 1.0 of them compiling; 0.5 s for "b", 0.2 of them compiling.
    expected = (2.0 - 1.0) + 1.0 / scale + (0.5 - 0.2) + 0.2 / scale
    assert fleet_sim.modelled_seconds(rank, compiles, scale) == pytest.approx(expected)


def test_a_waiter_on_its_hosts_lock_counts_its_hosts_compile() -> None:
    rank = {"pid": 2, "host": "h0", "go": 0.0, "graphs": [{"name": "a", "t": 3.0}]}
    mine = Compile("a", "h0", 1, end=2.9, seconds=1.0, code=0)
    other = Compile("a", "h1", 5, end=2.95, seconds=1.0, code=0)
    assert fleet_sim.waited_for(rank, "a", [other, mine], 0.0, 3.0) is mine
