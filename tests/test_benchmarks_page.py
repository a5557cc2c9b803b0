"""docs/benchmarks.md is what tests/bench/run_all.py wrote from a real run of every
benchmark, and run_all's own judgements (goals, better or worse) are right.

The benchmarks themselves do not run here (they take half an hour and load the whole
machine); this checks that the committed page is a full-mode run of every benchmark
run_all knows, that each figure's ratio is its two values' quotient, and that no
benchmark in tests/bench/ is missing from run_all.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "bench"
PAGE = ROOT / "docs" / "benchmarks.md"


def _run_all() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # run_all imports its sibling results.py
    try:
        name = "neffcache_bench_run_all"
        spec = importlib.util.spec_from_file_location(name, BENCH / "run_all.py")
        assert spec
        assert spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


run_all = _run_all()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _rows() -> list[dict[str, str]]:
    rows = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 10 and cells[0] in {b.name for b in run_all.BENCHES}:
            keys = ("bench", "figure", "value", "peer", "peer_value", "unit", "ratio", "vs", "goal")
            keys += ("notes",)
            rows.append(dict(zip(keys, cells, strict=True)))
    return rows


def test_every_benchmark_script_is_run_by_run_all() -> None:
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts == {b.script for b in run_all.BENCHES}


def test_the_page_is_a_full_run_of_every_benchmark() -> None:
    text = PAGE.read_text()
    assert "Written by tests/bench/run_all.py" in text
    assert "full mode" in text
    assert "quick mode" not in text
    assert "## Problems in this run" not in text
    benches = {row["bench"] for row in _rows()}
    assert benches == {b.name for b in run_all.BENCHES}
    for bench in run_all.BENCHES:  # each one's output is kept, and it passed
        assert re.search(rf"`python tests/bench/{bench.script}[^`]*`: \d+ s, passed\.", text)


def test_each_ratio_is_the_quotient_of_its_values() -> None:
    rows = _rows()
    assert len(rows) >= 20
    for row in rows:
        if row["ratio"] == "-":
            continue
        value, peer = _number(row["value"]), _number(row["peer_value"])
        # Values are printed with 3 significant figures at least: allow their rounding.
        assert _number(row["ratio"].removesuffix("x")) == pytest.approx(value / peer, rel=0.02)


def test_the_page_names_the_machine_and_versions() -> None:
    text = PAGE.read_text()
    assert re.search(r"- Machine: .*\d+ cores", text)
    for name in ("neffcache", "uvicorn", "blake3", "nginx", "redis-server"):
        assert re.search(rf"\b{name} \d", text), name


def _figure(ratio: float | None, goal: str, better: str = "higher") -> dict[str, Any]:
    return {"ratio": ratio, "goal": goal, "better": better}


@pytest.mark.parametrize(
    ("ratio", "goal", "expected"),
    [
        (0.72, ">= 0.8x", ">= 0.8x: NOT met"),
        (0.80, ">= 0.8x", ">= 0.8x: met"),
        (1.5, "<= 1.5x", "<= 1.5x: met"),
        (1.51, "<= 1.5x", "<= 1.5x: NOT met"),
        (3.0, "< 2 ms more", "< 2 ms more"),  # not a goal on the ratio: shown as is
        (None, ">= 0.9x", ">= 0.9x"),
        (2.0, "", "-"),
    ],
)
def test_goal_verdicts(ratio: float | None, goal: str, expected: str) -> None:
    assert run_all.goal_met(_figure(ratio, goal)) == expected


@pytest.mark.parametrize(
    ("ratio", "better", "expected"),
    [(0.5, "lower", "better"), (0.5, "higher", "worse"), (1.2, "higher", "better"),
     (1.2, "lower", "worse"), (1.001, "lower", "same"), (None, "lower", "-")],
)  # fmt: skip
def test_better_or_worse_follows_the_direction(
    ratio: float | None, better: str, expected: str
) -> None:
    assert run_all.compared(_figure(ratio, "", better)) == expected


def test_record_writes_nothing_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import results
    finally:
        sys.path.remove(str(BENCH))
    target = tmp_path / "figures.jsonl"
    monkeypatch.delenv(results.ENV, raising=False)
    results.record("b", "f", 2.0, "p", 4.0, "s", better="lower")
    assert not target.exists()
    monkeypatch.setenv(results.ENV, str(target))
    results.record("b", "f", 2.0, "p", 4.0, "s", better="lower", goal="<= 1x")
    results.record("b", "g", 1.0, "p", 0.0, "s", better="higher")
    first, second = (run_all.json.loads(line) for line in target.read_text().splitlines())
    assert first["ratio"] == 0.5
    assert first["goal"] == "<= 1x"
    assert second["ratio"] is None  # a zero peer has no ratio, rather than inf in JSON
