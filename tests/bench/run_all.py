"""Run every benchmark in tests/bench/ and write docs/benchmarks.md from what they measured.

    python tests/bench/run_all.py [--quick] [--only NAME ...] [--output docs/benchmarks.md]

Each benchmark runs as its own process, one after the other (they share two cores:
running two at once would measure each against the other). Each prints its full
report, which the page keeps verbatim, and records its headline figures through
``results.record``: a value measured in this run beside its peer's value measured in
the same run (nginx for serving, ``cp`` and the stock-layout directory for hits, curl
for large downloads, raw BLAKE3 for hashing, LRU for eviction, compile-every-time and
the stock caches for the fleet). The page opens with the machine and the versions of
everything measured, then one table of every figure as a ratio to its peer.

A benchmark that fails or runs past its time limit is reported as such on the page
(with its output so far), and this script exits 1; nothing is left out silently.
``--quick`` runs each benchmark's quick mode (a few minutes in all): the page then
says so, and its figures are not the goals' figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import needs  # noqa: E402
from results import ENV  # noqa: E402


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    quick: tuple[str, ...]  # arguments of the quick mode
    full: tuple[str, ...] = ()  # arguments of the full mode
    needs: tuple[str, ...] = ()  # executables it cannot run without
    limit: float = 20 * 60  # seconds before it is stopped and reported as timed out


# Cheap and self-contained first; the two that load the whole machine last.
BENCHES = (
    Bench("keying", "bench_keying.py", ("--quick",)),
    Bench("mlir_keying", "bench_mlir_keying.py", ("--quick",)),
    Bench("reports", "bench_reports.py", ("--quick",)),
    Bench("reports_load", "bench_reports_load.py", ("--quick",)),
    Bench("eviction", "bench_eviction.py", ("--scale", "0.3")),
    Bench("index", "bench_index.py", ("--quick",), needs=("redis-server",)),
    Bench("client", "bench_client.py", ("--quick",), needs=("nginx", "curl")),
    Bench("herd", "bench_herd.py", ("--quick",)),
    Bench("fleet", "bench_fleet.py", ("--quick",)),
    Bench("server", "bench_server.py", ("--quick",), needs=("nginx", "wrk")),
    Bench("load", "bench_load.py", ("--quick",), needs=("nginx", "redis-server")),
)

TOOLS = {  # executable -> the arguments that print its version
    "nginx": ["-v"],
    "redis-server": ["--version"],
    "wrk": ["--version"],
    "curl": ["--version"],
}
PACKAGES = (
    "neffcache",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "httpx",
    "blake3",
    "protobuf",
    "redis",
    "boto3",
    "moto",
    "jax",
)


# How each kind of figure was taken, for the page; each benchmark's output says more.
HOW = (
    "- **Per core (server, client, load).** With two usable cores or more, every server "
    "under test (neffcache, nginx, the nginx front with the neffcache server behind it, "
    "the replicas with Redis and moto) runs on one core and the load generator on "
    "another (`--pin`, as `taskset -c`): each side gets exactly one core, the same one "
    "for neffcache and its peer, so a ratio holds from one machine to the next. A "
    "server that shares cores with its client measures the scheduler as much as itself "
    "(two quiet unpinned runs of the same code once gave 0.80x and 0.37x nginx).",
    "- **Rounds.** The server's GET figures are alternating rounds (nginx, then "
    "neffcache, 5 times, wrk with one thread): the figure is the median round's, and "
    "the lowest and highest ratios of the rounds are its spread, in the table's notes "
    "and in the output. The client's whole-process figures are medians of 21 "
    "alternating runs (the floor, `cp`, the server hit, the L1 hit), each design in an "
    "alternation of its own, each run started once what the one before left running "
    "(the child that sends a hit's events, the shim's or its daemon's) has ended: on "
    "a host those run on other cores, here they would land in the next run's time. "
    "The load "
    "benchmark runs 60 s per configuration, once.",
    "- **Two interpreters (client).** The shim's hits (with its hit daemon, as "
    "shipped, and with `NEFFCACHE_DAEMON=0`) and `neffcache wrap`'s are timed "
    "in Python as installed and in a clean interpreter: a throwaway venv whose start "
    "runs no third-party code, where this machine's site-packages runs a `.pth` file "
    "that imports certifi (and with it pathlib, zipfile and more) at every start. "
    "That code is in the floor and in every hit alike, so as installed the hit looks "
    "cheaper beside the floor than it is on a host whose Python starts bare; the "
    "goals are judged in the clean interpreter.",
    "- **Flags.** A run where the client's core was full (the client, not the server, "
    "set the pace), or, pinned, where the server's core was not full, is flagged in "
    "its output and notes: its ratio is a bound, not a measurement of the server.",
    "- **Stand-ins.** The compile times in *herd* and *fleet* are the stand-in "
    "compiler's (`tests/standins/neuronx-cc`), not the real compiler's: those "
    "benchmarks count compiles and measure waiting, which do not depend on what the "
    "compiler does while it runs.",
)


@dataclass
class Outcome:
    bench: Bench
    argv: list[str]
    seconds: float = 0.0
    code: int | None = None  # None: not run (a tool is missing) or timed out
    output: str = ""
    problem: str = ""  # why it did not pass, for the page
    figures: list[dict[str, Any]] = field(default_factory=list)


def executable(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if Path(p).exists()), None
    )


def run(bench: Bench, quick: bool, scratch: Path) -> Outcome:
    argv = [sys.executable, str(HERE / bench.script), *(bench.quick if quick else bench.full)]
    outcome = Outcome(bench, argv)
    missing = [tool for tool in bench.needs if executable(tool) is None]
    if missing:
        outcome.problem = f"not run: {', '.join(missing)} not installed"
        return outcome
    figures = scratch / f"{bench.name}.jsonl"
    log = scratch / f"{bench.name}.log"
    env = {**os.environ, ENV: str(figures), "PYTHONUNBUFFERED": "1"}
    print(f"== {bench.name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    with log.open("wb") as out:
        # Its own session, so a time-out stops the servers it started as well.
        child = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            outcome.code = child.wait(timeout=bench.limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, 15)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 9)
                child.wait()
            outcome.problem = f"timed out after {bench.limit:.0f} s"
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, 15)
            child.wait()
            raise
    outcome.seconds = time.monotonic() - started
    outcome.output = log.read_text(errors="replace")
    if figures.exists():
        outcome.figures = [json.loads(line) for line in figures.read_text().splitlines() if line]
    if outcome.code not in (0, None):
        outcome.problem = f"exited {outcome.code}"
    elif outcome.code == 0 and not outcome.figures:
        outcome.problem = "recorded no figure"
    verdict = outcome.problem or f"{len(outcome.figures)} figure(s)"
    print(f"   {outcome.seconds:.0f} s, {verdict}", flush=True)
    return outcome


# --- the page ---------------------------------------------------------------------------


def version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def tool_version(name: str) -> str:
    path = executable(name)
    if path is None:
        return "absent"
    done = subprocess.run([path, *TOOLS[name]], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    if not first:
        return f"{name} ?"
    # Only the name and version: "curl 7.88.1 (x86_64...) libcurl/...", "Redis server
    # v=7.0.15 sha=...", "wrk debian/4.1.0 [epoll] Copyright ...", "nginx version: ...".
    words = first[0].replace("version:", "").split()
    version = next((w for w in words[1:] if any(c.isdigit() for c in w)), "?")
    return f"{name} {version.removeprefix('v=').removeprefix('nginx/')}"


def machine() -> list[str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = found[1].strip() if found else cpu
    mem = 0.0
    with contextlib.suppress(OSError):
        found = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        mem = int(found[1]) / 2**20 if found else 0.0
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return [
        f"- Machine: {platform.machine()}, {cpu}, {os.cpu_count()} cores "
        f"({len(os.sched_getaffinity(0))} usable), {mem:.1f} GiB RAM, "
        f"Linux {platform.release()}",
        f"- Python {platform.python_version()}; "
        + ", ".join(f"{p} {version_of(p)}" for p in PACKAGES),
        "- Tools: " + "; ".join(f"{tool_version(t)}" for t in TOOLS),
        f"- Source: commit `{commit or 'unknown'}`",
    ]


GOAL = re.compile(r"^\s*(<=|>=|<|>)\s*([0-9.]+)\s*x\s*$")


def goal_met(figure: dict[str, Any]) -> str:
    """'met' or 'NOT met' for a goal on the ratio (``>= 0.8x``), else the goal as text."""
    goal, ratio = figure.get("goal") or "", figure.get("ratio")
    found = GOAL.match(goal)
    if not found or ratio is None:
        return goal or "-"
    bound = float(found[2])
    met = {
        "<=": ratio <= bound,
        ">=": ratio >= bound,
        "<": ratio < bound,
        ">": ratio > bound,
    }[found[1]]
    return f"{goal}: {'met' if met else 'NOT met'}"


def number(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def compared(figure: dict[str, Any]) -> str:
    ratio = figure.get("ratio")
    if ratio is None:
        return "-"
    if abs(ratio - 1) < 0.005:
        return "same"
    good = ratio > 1 if figure["better"] == "higher" else ratio < 1
    return "better" if good else "worse"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def figures_table(outcomes: Sequence[Outcome]) -> list[str]:
    lines = [
        "| benchmark | figure | neffcache | peer (same run) | peer's | unit | ratio "
        "| vs peer | goal | how, and caveats |",
        "|---|---|---:|---|---:|---|---:|---|---|---|",
    ]
    for outcome in outcomes:
        for f in outcome.figures:
            ratio = "-" if f["ratio"] is None else f"{f['ratio']:.3g}x"
            lines.append(
                f"| {outcome.bench.name} | {cell(f['figure'])} | {number(f['value'])} "
                f"| {cell(f['peer'])} | {number(f['peer_value'])} | {cell(f['unit'])} "
                f"| {ratio} | {compared(f)} | {cell(goal_met(f))} | {cell(f.get('note', ''))} |"
            )
    return lines


def first_paragraph(script: Path) -> str:
    text = script.read_text()
    found = re.match(r'\s*"""(.*?)(?:\n\s*\n|""")', text, re.S)
    return " ".join(found[1].split()) if found else ""


def page(outcomes: Sequence[Outcome], quick: bool, started: datetime.datetime) -> str:
    mode = "quick mode (`--quick`): short runs and small sizes" if quick else "full mode"
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by tests/bench/run_all.py; run it again rather than editing. -->",
        "",
        "Every figure below was measured in one run of `python tests/bench/run_all.py"
        f"{' --quick' if quick else ''}`, {mode}, started "
        f"{started.strftime('%Y-%m-%d %H:%M UTC')}, beside its peer measured in the same "
        "run on the same machine. A ratio is neffcache's value divided by the peer's; "
        "*vs peer* says which side of the peer it fell, given which way is better for "
        "that figure. The benchmarks print more than their headline figures: each one's "
        "full output is below the table. Nothing here is a timed assertion: the test "
        "suite checks behaviour, these scripts measure it.",
        "",
        "How the figures were taken:",
        "",
        *HOW,
        "",
        f"What they need: {needs.NEEDS}.",
        "",
        "## Machine and versions",
        "",
        *machine(),
        "",
        "## Figures",
        "",
        *figures_table(outcomes),
        "",
    ]
    problems = [o for o in outcomes if o.problem]
    if problems:
        lines += ["## Problems in this run", ""]
        lines += [f"- **{o.bench.name}**: {o.problem}" for o in problems]
        lines.append("")
    lines += ["## Each benchmark", ""]
    for o in outcomes:
        script = HERE / o.bench.script
        command = " ".join(["python", f"tests/bench/{o.bench.script}", *o.argv[2:]])
        status = o.problem or "passed"
        lines += [
            f"### {o.bench.name}",
            "",
            first_paragraph(script),
            "",
            f"`{command}`: {o.seconds:.0f} s, {status}.",
            "",
        ]
        if o.output:
            lines += ["```text", o.output.rstrip().replace("```", "'''"), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode")
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", nargs="+", choices=names, default=names, metavar="NAME")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    missing = sorted(set(p.name for p in HERE.glob("bench_*.py")) - {b.script for b in BENCHES})
    if missing:  # a new benchmark must be listed above, or the page silently lacks it
        parser.error(f"not in BENCHES: {', '.join(missing)}")
    if importlib.util.find_spec("jax") is None:  # before half an hour of other runs
        parser.error(needs.NEEDS)
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="neffcache-run-all-") as scratch:
        outcomes = [run(b, args.quick, Path(scratch)) for b in BENCHES if b.name in args.only]
    args.output.write_text(page(outcomes, args.quick, started))
    failed = [o.bench.name for o in outcomes if o.problem]
    print(f"wrote {args.output}; {'problems: ' + ', '.join(failed) if failed else 'all passed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
