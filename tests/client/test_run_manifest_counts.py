"""The run manifest's recipes in docs/client.md ("One graph, one line") count each graph
once, whichever interception points saw it.

The recipes are read out of the page and run with the real ``jq`` when it is
installed (in CI, ``.ci/run`` installs it: there it must be); a Python equivalent of
each, pinned to the page's text, runs everywhere. The end-to-end run has the hook and
the shim both active, the recommended set-up: a graph the shim compiles, one it
finds in L1 (the hook's line for each says ``delegated``), and one the hook finds
itself, without the shim.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from support.e2e import BLOCK_A, BLOCK_B, Sandbox, Server, read_run_manifest

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
SECTION = "### One graph, one line"
# The page's programs, whitespace collapsed: a change there must change the Python
# equivalents below (count_graphs, misses) too.
COUNT_PROGRAM = (
    "map(select(.resolved_by == null)) | group_by([.result, .source]) "
    "| map({result: .[0].result, source: .[0].source, graphs: length})"
)
MISSES_PROGRAM = 'select(.result == "miss" and .resolved_by == null) | [.reason, .reason_summary]'

Line = dict[str, Any]


def recipes() -> list[list[str]]:
    """The ``jq`` commands of the page's fenced blocks in the section, as argv."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.find("\n## ")]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    return [shlex.split(block) for block in blocks if block.startswith("jq ")]


def recipe(program: str) -> list[str]:
    """The page's argv whose program is ``program`` (whitespace collapsed)."""
    found = [argv for argv in recipes() if " ".join(argv[-2].split()) == program]
    assert len(found) == 1, f"docs/client.md has no single recipe {program!r}: {recipes()}"
    return found[0]


def _jq_order(value: str | None) -> tuple[bool, str]:
    # jq sorts null before strings, and strings by code point.
    return (value is not None, value or "")


def count_graphs(lines: Iterable[Line]) -> list[Line]:
    """COUNT_PROGRAM in Python."""
    counted = Counter(
        (line.get("result"), line.get("source"))
        for line in lines
        if line.get("resolved_by") is None
    )
    order = sorted(counted, key=lambda pair: (_jq_order(pair[0]), _jq_order(pair[1])))
    return [{"result": r, "source": s, "graphs": counted[(r, s)]} for r, s in order]


def misses(lines: Iterable[Line]) -> list[list[Any]]:
    """MISSES_PROGRAM in Python."""
    return [
        [line.get("reason"), line.get("reason_summary")]
        for line in lines
        if line.get("result") == "miss" and line.get("resolved_by") is None
    ]


def jq_or_skip() -> str:
    found = shutil.which("jq")
    if found is not None:
        return found
    if os.environ.get("CI"):
        pytest.fail("jq is not installed; .ci/run installs it in CI")
    pytest.skip("jq is not installed: the docs' recipes ran as their Python equivalents only")


def run_jq(argv: list[str], manifest: Path) -> list[Any]:
    """The page's command with its ``PATH`` placeholder the manifest; jq's values."""
    assert (argv[0], argv[-1]) == ("jq", "PATH"), argv
    done = subprocess.run(
        [jq_or_skip(), "-c", *argv[1:-1], str(manifest)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(value) for value in done.stdout.splitlines()]


def totals(counted: list[Line]) -> dict[str, int]:
    by_result: Counter[str] = Counter()
    for group in counted:
        by_result[group["result"]] += group["graphs"]
    return dict(by_result)


def write(path: Path, lines: Iterable[Line]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# --- the recipes on lines of every kind -------------------------------------------------

_A = "neuronxcc-2.20.9961.0+0acef03a/MODULE_1+3cc9a3cb"
_B = "neuronxcc-2.20.9961.0+0acef03a/MODULE_2+3cc9a3cb"
_C = "neuronxcc-2.20.9961.0+0acef03a/MODULE_3+3cc9a3cb"
_D = "neuronxcc-2.20.9961.0+0acef03a/MODULE_4+3cc9a3cb"
_DELEGATED = {"result": "delegated", "source": "wrapper", "resolved_by": "wrapper"}
# Five graphs: the shim's compile and hit under the hook (its lines delegated), one
# the hook found itself, a compile through the hook alone, and, from an older client,
# a shim hit whose hook line said miss (with resolved_by).
EVERY_KIND: list[Line] = [
    {"via": "wrapper", "result": "miss", "source": "compiler", "reason": "new-graph",
     "reason_summary": "never compiled", "neuron_address": _A},
    {"via": "hook", **_DELEGATED, "reason": None, "neuron_address": _A},
    {"via": "wrapper", "result": "hit", "source": "server", "neuron_address": _B},
    {"via": "hook", **_DELEGATED, "reason": None, "neuron_address": _B},
    {"via": "hook", "result": "hit", "source": "l1", "neuron_address": _A},
    {"via": "hook", "result": "miss", "source": "compiler", "reason": "unknown",
     "reason_summary": None, "neuron_address": _C},
    {"via": "wrapper", "result": "hit", "source": "l1", "neuron_address": _D},
    {"via": "hook", "result": "miss", "source": "compiler", "resolved_by": "wrapper",
     "reason": "unknown", "neuron_address": _D},
]  # fmt: skip
EVERY_KIND_COUNTED = [
    {"result": "hit", "source": "l1", "graphs": 2},
    {"result": "hit", "source": "server", "graphs": 1},
    {"result": "miss", "source": "compiler", "graphs": 2},
]
EVERY_KIND_MISSES = [["new-graph", "never compiled"], ["unknown", None]]


def test_the_python_equivalents_count_each_graph_once() -> None:
    assert count_graphs(EVERY_KIND) == EVERY_KIND_COUNTED
    assert misses(EVERY_KIND) == EVERY_KIND_MISSES


def test_the_docs_recipes_are_the_pinned_programs() -> None:
    assert recipe(COUNT_PROGRAM)[:2] == ["jq", "-s"]
    assert recipe(MISSES_PROGRAM)[:1] == ["jq"]


def test_jq_runs_the_docs_recipes_as_the_python_equivalents(tmp_path: Path) -> None:
    manifest = write(tmp_path / "run.jsonl", EVERY_KIND)
    assert run_jq(recipe(COUNT_PROGRAM), manifest) == [EVERY_KIND_COUNTED]
    assert run_jq(recipe(MISSES_PROGRAM), manifest) == EVERY_KIND_MISSES


# --- the hook and the shim, end to end --------------------------------------------------


@pytest.mark.e2e
def test_with_the_hook_and_the_shim_the_docs_recipes_count_each_graph_once(
    server: Server, sandbox: Sandbox
) -> None:
    manifest = sandbox.root / "run.jsonl"
    extra = {"NEFFCACHE_RUN_MANIFEST": str(manifest)}
    url = server.cache_url(sandbox.namespace)
    env = sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True, shim=True, extra=extra)
    # BLOCK_A: the shim compiles it. BLOCK_B (the same program, traced again: another
    # stock address): the shim finds it in L1. BLOCK_A again: the hook finds its stock
    # entry, and the shim never runs.
    names = [BLOCK_A, BLOCK_B, BLOCK_A]
    training = sandbox.train(env, names)
    training.done.check()
    assert len(training.graphs) == len(names)
    compiles = sandbox.compiles()
    assert compiles == 1

    lines = read_run_manifest(manifest)
    seen = Counter((line["via"], line["result"], line["source"]) for line in lines)
    assert seen == {
        ("wrapper", "miss", "compiler"): 1,
        ("wrapper", "hit", "l1"): 1,
        ("hook", "delegated", "wrapper"): 2,
        ("hook", "hit", "l1"): 1,
    }, lines
    true_counts = {"hit": len(names) - compiles, "miss": compiles}
    counted = count_graphs(lines)
    assert totals(counted) == true_counts, counted
    assert len(misses(lines)) == compiles

    (jq_counted,) = run_jq(recipe(COUNT_PROGRAM), manifest)
    assert jq_counted == counted
    assert totals(jq_counted) == true_counts
    assert run_jq(recipe(MISSES_PROGRAM), manifest) == misses(lines)
