"""Live: a tiny graph compiled with each stack installed, twice, each time on a fresh
L1 and fresh stack caches; the second must be a hit from the server, through the
interception point that serves that stack (docs/client.md's table): the shim for
TorchNeuron, vLLM Neuron and ``torch_neuronx.trace``, the hook for libneuronxla's
persistent cache.

The group runs only when asked (``--live``, ``--only live``): it compiles, takes
minutes on a real host, and publishes an entry per stack into the configured
namespace (``live_run.MODEL`` labels them). Stacks are found as the stacks group
finds them. How each is driven is ``live_drivers``; the run itself, ``live_run``;
what it showed, ``live_facts``.

Bounds: each child has ``live_run.CHILD_TIMEOUT``; the live checks together stop at
``Context.live_seconds`` from the first of them (``--live-deadline``): a run that
would start later is not started, and one running then is killed.

Verdicts: a stack that cannot be driven here (not importable, no device) is SKIP; a
first compile that fails, a graph that reaches no interception point, or a second
run that compiles again is FAIL; a second run served by the server through the other
point, or a driver that fails before any compile (its idea of the stack's API is
wrong), is WARN with a request for the report.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from neffcache.client.doctor import live_facts, live_run, stack_checks, words
from neffcache.client.doctor.context import Context
from neffcache.client.doctor.live_child import DRIVERS_ENV
from neffcache.client.doctor.live_run import Run
from neffcache.client.doctor.model import Check, Result, failed, passed, skipped, warned

# A child with less time than this left before the deadline is not started.
MIN_CHILD_SECONDS = 1.0
_SEND = "attach `neffcache doctor --live --report FILE` to an issue"


class Stack(NamedTuple):
    name: str  # the check's id after ``live.``, and the driver's name
    title: str
    point: str  # ``shim`` or ``hook``: what must serve the second run
    present: Callable[[Context], str | Result]  # what is installed, or a SKIP


def _torchneuron(ctx: Context) -> str | Result:
    found = stack_checks.version_of(ctx, "torch-neuronx")
    if found is None:
        return skipped("torch-neuronx is not installed")
    torch = ctx.dists().get("torch")
    if not stack_checks.is_torchneuron(torch):
        return skipped(
            f"torch-neuronx {found[1]} is of the torch-xla era (torch {torch or '?'}): its "
            "graphs go through libneuronxla (live.libneuronxla)"
        )
    return f"TorchNeuron (torch-neuronx {found[1]}, torch {torch})"


def _vllm(ctx: Context) -> str | Result:
    found = stack_checks.version_of(ctx, "vllm-neuron", "libtorch-neuronx-lite")
    if found is None:
        return skipped("vllm-neuron and libtorch-neuronx-lite are not installed")
    return f"vLLM Neuron ({found[0]} {found[1]})"


def _trace(ctx: Context) -> str | Result:
    found = stack_checks.version_of(ctx, "torch-neuronx")
    if found is None:
        return skipped("torch-neuronx is not installed")
    return f"torch_neuronx.trace (torch-neuronx {found[1]})"


def _libneuronxla(ctx: Context) -> str | Result:
    found = stack_checks.version_of(ctx, "libneuronxla")
    if found is None and not any(f.get("libneuronxla_found") for _, f in ctx.training_pythons()):
        return skipped("libneuronxla is not installed")
    return f"libneuronxla {found[1] if found else '(no metadata)'}"


STACKS = (
    Stack("torchneuron", "TorchNeuron", "shim", _torchneuron),
    Stack("vllm-neuron", "vLLM Neuron", "shim", _vllm),
    Stack("trace", "torch_neuronx.trace", "shim", _trace),
    Stack("libneuronxla", "libneuronxla", "hook", _libneuronxla),
)


def gate(ctx: Context) -> Result | None:
    """Why no stack can be tried here, or None."""
    config = ctx.config()
    if ctx.read_only:
        return skipped("--read-only: --live publishes an entry per stack")
    if config.config is None or config.disabled:
        return skipped("no usable neffcache URL (see config.url)")
    status = ctx.server_status()
    if status is None or status.state in ("down", "error"):
        detail = status.detail if status else "no server"
        return failed(
            f"the server cannot be used ({detail}): the second run could only compile again",
            "see server.reach",
        )
    if status.state in ("unauthorized", "forbidden"):
        return failed(f"the server refuses this token ({status.detail})", "see config.token")
    caller = status.body.get("caller") if status.state == "ok" else None
    if isinstance(caller, dict) and caller.get("scope") == "read":
        return warned(
            "the token may only read: the first run cannot publish, so the second compiles again",
            "run --live with a token that may write to the namespace (see config.token)",
        )
    return None


def _deadline(ctx: Context) -> float:
    return ctx.once("live deadline", lambda: time.monotonic() + ctx.live_seconds)


def _budget(ctx: Context) -> float | None:
    """This child's timeout, or None when the deadline leaves too little."""
    left = _deadline(ctx) - time.monotonic()
    return min(live_run.CHILD_TIMEOUT, left) if left >= MIN_CHILD_SECONDS else None


def check(stack: Stack) -> Callable[[Context], Result]:
    def run(ctx: Context) -> Result:
        what = stack.present(ctx)
        if isinstance(what, Result):
            return what
        stopped = gate(ctx)
        if stopped is not None:
            return stopped
        return _live(ctx, stack, what)

    return run


def _live(ctx: Context, stack: Stack, what: str) -> Result:
    seed = int.from_bytes(os.urandom(6), "big")
    real = ctx.real_compiler() if stack_checks.points(ctx).shim is None else None
    root = Path(tempfile.mkdtemp(prefix="neffcache-doctor-live-", dir=ctx.environ.get("TMPDIR")))
    runs: list[Run] = []

    def again() -> bool:
        timeout = _budget(ctx)
        if timeout is not None:
            where = root / f"run-{len(runs) + 1}"
            runs.append(live_run.run(ctx.environ, where, stack.name, seed, timeout, real))
        return timeout is not None

    try:
        if not again():
            return _out_of_time(ctx, what, runs)
        verdict = _first(ctx, stack, what, runs[0])
        if verdict is None:
            verdict = _second(stack, what, runs) if again() else _out_of_time(ctx, what, runs)
        return _with_facts(ctx, stack, verdict, runs, seed)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _out_of_time(ctx: Context, what: str, runs: list[Run]) -> Result:
    return warned(
        f"{what}: not run{' again' if runs else ''}: the --live deadline "
        f"({ctx.live_seconds:g} s) had passed",
        "run `neffcache doctor --only live` with a longer --live-deadline",
    )


def _first(ctx: Context, stack: Stack, what: str, run: Run) -> Result | None:
    """The verdict after the first run, or None to go on with the second."""
    error = str(run.reply.get("error") or "no answer from the driver")
    if run.status == "unavailable":
        return skipped(f"{what}: cannot be driven here: {error}")
    if run.status == "killed":
        return _killed(what, "first", run)
    if live_facts.graphs(run) or run.compiles():
        if run.status == "error":
            return failed(
                f"{what}: the first compile failed: {error}",
                "the log lines below are the compile's: a job here fails the same way",
            )
        return None if live_facts.graphs(run) else _unreached(what)
    broken = _broken_point(ctx, stack, run)
    if broken is not None:
        return failed(f"{what}: the compile never reached neffcache: {broken[0]}", broken[1])
    if run.status == "error":
        return warned(
            f"{what}: the doctor could not drive it (nothing reached neffcache): {error}",
            f"{_SEND}: the doctor drives this stack differently from what it accepts here",
        )
    return _unreached(what)


def _broken_point(ctx: Context, stack: Stack, run: Run) -> tuple[str, str] | None:
    """(what is wrong, its fix) with the point that should have seen the compile."""
    points = stack_checks.points(ctx)
    if stack.point == "shim" and points.shim:
        return points.shim, words.SHIM_FIRST
    loaded, armed = run.reply.get("libneuronxla_loaded"), run.reply.get("hook_armed")
    if stack.point == "hook" and loaded and not armed:
        return "the hook did not arm in the driver's Python", "see hook.armed and paths.neffcache"
    return None


def _unreached(what: str) -> Result:
    return failed(
        f"{what}: the compile wrote no run-manifest line: it reached no interception point",
        f"{_SEND}: this stack compiles by a path neffcache does not see",
    )


def _killed(what: str, which: str, run: Run) -> Result:
    if run.timeout < live_run.CHILD_TIMEOUT:
        return warned(
            f"{what}: the {which} run was stopped at the --live deadline after {run.seconds:.0f} s",
            "run `neffcache doctor --only live` with a longer --live-deadline",
        )
    return failed(
        f"{what}: the {which} run did not finish within {run.timeout:.0f} s: a tiny compile hung",
        "the log lines below say where it stopped",
    )


def _second(stack: Stack, what: str, runs: list[Run]) -> Result:
    first, run = runs
    if run.status == "killed":
        return _killed(what, "second", run)
    if run.status != "ok":
        error = run.reply.get("error") or f"exit {run.code}"
        return failed(
            f"{what}: the second run failed: {error}", "the log lines below are the run's"
        )
    found = live_facts.graphs(run)
    if not found:
        return failed(
            f"{what}: the second run's graph reached no interception point",
            f"{_SEND}: something answered before neffcache (a stack cache the doctor did not move)",
        )
    compiled = [(p, g) for p, g in found if g.get("source") == "compiler"]
    if compiled or run.compiles():
        return _compiled_again(what, first, compiled)
    if any(g.get("source") != "server" for _, g in found):
        return failed(
            f"{what}: the second run was served from L1, which was empty: the stack's "
            "processes do not use NEFFCACHE_LOCAL_DIR",
            _SEND,
        )
    others = sorted({p for p, _ in found if p != stack.point})
    if others:
        return warned(
            f"{what}: the second run was a server hit, but through the {others[0]}, not the "
            f"{stack.point}",
            f"{_SEND}: the {stack.point} does not serve this stack as neffcache assumes",
        )
    compiled_first = any(g.get("source") == "compiler" for _, g in live_facts.graphs(first))
    began = "compiled" if compiled_first else "served already (the server held the graph)"
    return passed(
        f"{what}: {began} in {first.seconds:.1f} s, then a hit from the server through the "
        f"{stack.point} in {run.seconds:.1f} s, on a fresh L1"
    )


def _compiled_again(what: str, first: Run, compiled: list[tuple[str, dict[str, Any]]]) -> Result:
    reasons = sorted({str(g.get("fallback") or g.get("reason") or "?") for _, g in compiled})
    keys = {g.get("key") or g.get("neuron_address") for _, g in live_facts.graphs(first)}
    changed = [g for _, g in compiled if (g.get("key") or g.get("neuron_address")) not in keys]
    why = f" (miss reason: {words.listed(reasons)})" if compiled else ""
    if changed:
        why += "; its key differs from the first run's: the stack's graph is not the same twice"
    fix = (
        "see server.reach: the server was not there when the run asked"
        if "server-unavailable" in reasons
        else f"{_SEND}: the first run's entry did not serve the second"
    )
    return failed(f"{what}: the second run, on a fresh L1, compiled again{why}", fix)


def _with_facts(ctx: Context, stack: Stack, verdict: Result, runs: list[Run], seed: int) -> Result:
    """``verdict`` with what the runs showed: details and data."""
    config = ctx.config().config
    entry = live_facts.entry(config, runs) if config is not None else None
    override = ctx.environ.get(DRIVERS_ENV)
    facts = (runs[0].reply.get("facts") or {}) if runs else {}
    details = [f"driven: {facts.get('graph') or stack.title}"]
    if override:
        details.append(f"by the test drivers in {override} ({DRIVERS_ENV})")
    for index, run in enumerate(runs, 1):
        details.append(live_facts.run_line(index, run))
        details += live_facts.argv_lines(index, run)
        details += [line for line in [live_facts.calls_line(index, run)] if line]
    details += [line for line in [live_facts.entry_line(entry)] if line]
    if runs and verdict.status.value in ("FAIL", "WARN") and runs[-1].tail:
        details += [f"log: {line}" for line in runs[-1].tail]
    data: dict[str, Any] = {
        "stack": stack.name,
        "point": stack.point,
        "seed": seed,
        "drivers": override or "neffcache",
        "runs": [live_facts.run_data(run) for run in runs],
        "entry": entry,
    }
    return dataclasses.replace(
        verdict, details=(*verdict.details, *details), data={**verdict.data, **data}
    )


CHECKS = tuple(Check(f"live.{s.name}", s.title, check(s)) for s in STACKS)
