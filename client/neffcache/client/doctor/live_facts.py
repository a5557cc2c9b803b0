"""What ``--live`` runs showed, in words and as data: each run's graphs (from its run
manifest), the SDK's calls on the hook's cache, the real compiler's argv, and the
entry the server holds for the graph (its files' names and sizes).

A graph is one run-manifest line, but the hook's lines that say ``resolved_by``:
the SDK's compile then ran the shim, which resolved the graph and wrote the line that
counts (runlog.py). Which point resolved a graph is its line's ``via``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from neffcache.client.api import Api
from neffcache.client.config import ClientConfig
from neffcache.client.doctor import serverfacts, words
from neffcache.client.doctor.live_run import Run
from neffcache.client.http import HttpError
from neffcache.protocol import routes

# The manifest fields the output keeps (the rest, the process's counters, are noise).
_KEPT = (
    "via",
    "result",
    "source",
    "outcome",
    "reason",
    "fallback",
    "resolved_by",
    "key",
    "direct_key",
    "neuron_address",
    "compiler_version",
    "fetch_seconds",
    "compile_seconds",
    "bytes",
)
# At most this many of the SDK's calls are kept per run (a real run asks per graph).
MAX_CALLS = 400


def graphs(run: Run) -> list[tuple[str, dict[str, Any]]]:
    """(``shim`` or ``hook``, its line) for each graph the run resolved."""
    found = []
    for line in run.graphs:
        if not isinstance(line, dict) or (line.get("via") == "hook" and line.get("resolved_by")):
            continue
        found.append(("hook" if line.get("via") == "hook" else "shim", line))
    return found


def said(point: str, line: dict[str, Any]) -> str:
    """One graph in words: ``a hit from the server through the shim``."""
    if line.get("result") == "hit":
        source = "the server" if line.get("source") == "server" else str(line.get("source"))
        return f"a hit from {source} through the {point}"
    why = f" ({line['reason']})" if line.get("reason") else ""
    if line.get("fallback"):
        why = f" ({line['fallback']})"
    outcome = line.get("outcome")
    if outcome == "ok":
        return f"a miss{why}, compiled through the {point}"
    if outcome == "failed":
        return f"a miss{why} whose compile failed, through the {point}"
    return f"a miss{why}: a failure replayed through the {point}"


def run_line(index: int, run: Run) -> str:
    found = graphs(run)
    what = "; ".join(said(p, line) for p, line in found) or "no graph reached neffcache"
    ending = "killed at its timeout" if run.code is None else f"exit {run.code}"
    return f"run {index} (fresh L1): {what}; {ending} after {run.seconds:.1f} s"


def call_text(call: dict[str, Any]) -> str:
    text = str(call.get("call"))
    if call.get("arg"):
        text += f"({call['arg']})"
    if "result" in call:
        text += f"={call['result']}"
    if call.get("raised"):
        text += f" raised {call['raised']}"
    return text


def calls_line(index: int, run: Run) -> str | None:
    """The SDK's calls on the hook's cache in order, repeats folded (``... x3``)."""
    if not run.calls:
        return None
    folded: list[list[Any]] = []
    for call in run.calls:
        text = call_text(call)
        if folded and folded[-1][0] == text:
            folded[-1][1] += 1
        else:
            folded.append([text, 1])
    listed = ", ".join(t if n == 1 else f"{t} x{n}" for t, n in folded)
    return f"cache calls (run {index}): {listed}"


def argv_lines(index: int, run: Run) -> list[str]:
    if run.compiler is None:
        return [f"real compiler argv (run {index}): not recorded (the shim is not first on PATH)"]
    return [
        f"real compiler argv (run {index}): {shlex.join(['neuronx-cc', *argv])}"
        for argv in run.compiles()
    ]


def run_data(run: Run) -> dict[str, Any]:
    return {
        "status": run.status,
        "exit": run.code,
        "seconds": run.seconds,
        "timeout": round(run.timeout, 3),
        "facts": run.reply.get("facts") or {},
        "error": run.reply.get("error"),
        "hook_armed": run.reply.get("hook_armed"),
        "graphs": [{k: line.get(k) for k in _KEPT if k in line} for _, line in graphs(run)],
        "cache_calls": [call_text(c) for c in run.calls[:MAX_CALLS]],
        "compiler_argv": None
        if run.compiler is None
        else [["neuronx-cc", *a] for a in run.compiler],
    }


def entry(config: ClientConfig, runs: Sequence[Run]) -> dict[str, Any] | None:
    """The server's entry for the graph the runs resolved (the last run's first), with
    its files' sizes; ``{"error": ...}`` when it cannot be read; None: no graph."""
    ns = config.namespace
    paths = []
    for run in reversed(runs):
        for _, line in graphs(run):
            if line.get("key"):
                paths.append(routes.entry_path(ns, str(line["key"])))
            for field in ("direct_key", "neuron_address"):
                if line.get(field):
                    paths.append(routes.alias_path(ns, str(line[field])))
    if not paths:
        return None
    api = serverfacts.open_api(config)
    try:
        return _read_entry(api, paths)
    finally:
        api.close()


def _read_entry(api: Api, paths: list[str]) -> dict[str, Any]:
    answer = None
    for path in dict.fromkeys(paths):
        try:
            answer = api.get(path)
        except HttpError as exc:
            return {"error": f"cannot read the entry: {exc}"}
        if answer.status == 200:
            break
    if answer is None or answer.status != 200:
        status = answer.status if answer is not None else "no answer"
        return {"error": f"the server has no entry for the graph (HTTP {status})"}
    try:
        body = json.loads(answer.body)
        files = {str(n): int(f["size"]) for n, f in dict(body.get("files") or {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {"error": "the entry the server answered is no manifest"}
    kept = ("key", "neuron_address", "model", "namespace", "writer", "created_at")
    return {
        **{k: body.get(k) for k in kept},
        "compile_seconds": body.get("compile_seconds"),
        "files": files,
    }


def entry_line(found: dict[str, Any] | None) -> str | None:
    if found is None:
        return None
    if "error" in found:
        return f"entry on the server: {found['error']}"
    files = ", ".join(f"{name} {words.size(size)}" for name, size in sorted(found["files"].items()))
    return f"entry on the server: {found.get('key')} (model {found.get('model')}): {files}"
