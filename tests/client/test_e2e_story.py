"""End to end, the whole product in one story: training jobs through the
persistent-cache hook (the stand-in ``libneuronxla``, activated by one variable), then
the questions a platform team asks, answered by the ``neffcache`` commands a person
would type.

1. ``cold``: a fresh fleet compiles two graphs (``new-graph``).
2. ``warm``: a new job on a fresh host hits both on the server, each hit credited with
   the compile time of the entry it served.
3. ``upgrade``: the same job under a newer compiler, plus a shape variant of one graph:
   two ``compiler-changed`` misses and one ``shapes-changed``.
4. ``neffcache report`` adds those up (compiles, hours spent and saved, money at the
   shipped trn1.32xlarge price, runs cold, warm and mixed, misses by reason);
   ``neffcache explain KEY`` says why the upgraded graph missed, and why the variant
   did, instruction by instruction; ``neffcache report upgrade`` plans the next
   upgrade.

The commands' outputs are kept as test artifacts (``$NEFFCACHE_TEST_ARTIFACTS`` or
``build/test-artifacts``), under ``e2e-story/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    NEFFCACHE,
    OTHER,
    STANDIN_VERSION,
    VARIANT,
    Done,
    Sandbox,
    Server,
    read_run_manifest,
)

from neffcache.server.index import open_index

pytestmark = pytest.mark.e2e

INSTANCE = "trn1.32xlarge"
MODEL = "llama-block"
UPGRADED = "2.21.1.0+6b1fa2e4"
NEXT = "2.22.0.0+00c0ffee"
DELAY = 1.0  # the stand-in compiler's seconds per compile
ROOT = Path(__file__).resolve().parents[2]


def artifacts() -> Path:
    configured = os.environ.get("NEFFCACHE_TEST_ARTIFACTS")
    folder = (Path(configured) if configured else ROOT / "build" / "test-artifacts") / "e2e-story"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def graph_events(server: Server, namespace: str) -> list[dict[str, Any]]:
    """Every graph event the server stored for ``namespace``, oldest first."""
    index = open_index(f"sqlite://{server.data_dir / 'index.db'}")
    try:
        found: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page, after = index.events(0.0, float("inf"), [namespace], after, 500)
            found += [json.loads(e.body) for e in page if e.kind == "graph"]
            if after is None:
                return found
    finally:
        index.close()


def command(sandbox: Sandbox, env: dict[str, str], name: str, *args: str) -> str:
    """Run ``neffcache ARGS``; its stdout, also kept as the artifact ``name``."""
    done: Done = sandbox.run([*NEFFCACHE, *args], env, timeout=60)
    assert done.returncode == 0, done.describe()
    (artifacts() / name).write_text(f"$ neffcache {' '.join(args)}\n{done.stdout}")
    return done.stdout


def test_jobs_then_report_and_explain(private_server: Server, sandbox: Sandbox) -> None:
    server = private_server
    namespace = sandbox.namespace
    manifest = sandbox.root / "run.jsonl"

    def job(name: str, graphs: list[str], **extra: str) -> None:
        env = sandbox.env(
            l1=sandbox.new_dir("l1"),  # a fresh host each time
            url=server.cache_url(namespace),
            url_var="NEURON_CC_FLAGS",
            hook=True,
            extra={
                "NEFFCACHE_RUN_MANIFEST": str(manifest),
                "NEFFCACHE_JOB_ID": name,
                "NEFFCACHE_INSTANCE_TYPE": INSTANCE,
                "NEFFCACHE_MODEL": MODEL,
                "NEFFCACHE_STANDIN_DELAY": str(DELAY),
                **extra,
            },
        )
        run = sandbox.train(env, graphs)
        assert run.done.returncode == 0, run.done.describe()

    job("cold", [BLOCK_A, OTHER])
    job("warm", [BLOCK_A, OTHER])
    job("upgrade", [BLOCK_A, OTHER, VARIANT], NEFFCACHE_STANDIN_VERSION=UPGRADED)
    assert sandbox.compiles() == 5  # 2 cold, 0 warm, 3 after the upgrade

    lines = read_run_manifest(manifest)
    assert [(line["result"], line["source"]) for line in lines] == [
        ("miss", "compiler"),
        ("miss", "compiler"),
        ("hit", "server"),
        ("hit", "server"),
        ("miss", "compiler"),
        ("miss", "compiler"),
        ("miss", "compiler"),
    ]
    assert [line["reason"] for line in lines] == [
        "new-graph",
        "new-graph",
        None,
        None,
        "compiler-changed",
        "compiler-changed",
        "shapes-changed",
    ]
    events = graph_events(server, namespace)
    assert [e.get("reason") for e in events] == [line["reason"] for line in lines]
    spent = sum(e["compile_seconds"] for e in events if e["result"] == "miss")
    saved = sum(e["saved_seconds"] for e in events if e["result"] == "hit")
    assert spent >= 5 * DELAY
    assert saved >= 2 * DELAY

    # What a person on a training host has: the job's own cache URL.
    env = sandbox.env(
        l1=sandbox.new_dir("l1"), url=server.cache_url(namespace), url_var="NEFFCACHE_URL"
    )
    # The same report as JSON, to check the table's figures against.
    report = json.loads(
        command(sandbox, env, "report.json", "report", "--since", "1d", "--format", "json")
    )
    totals = report["totals"]
    assert (totals["lookups"], totals["hits"], totals["misses"]) == (7, 2, 5)
    assert (totals["compiles"], totals["failed_compiles"]) == (5, 0)
    assert abs(totals["compile_hours_spent"] - spent / 3600) < 1e-9
    assert abs(totals["compile_hours_saved"] - saved / 3600) < 1e-9
    assert totals["miss_reasons"] == {
        "new-graph": 2,
        "compiler-changed": 2,
        "shapes-changed": 1,
    }
    assert totals["cost_saved"] is not None  # trn1.32xlarge has a shipped price
    assert totals["cost_saved"] > 0
    assert report["runs"]["cold"] == 2  # the first job, and the upgraded one
    assert report["runs"]["warm"] == 1
    table = command(sandbox, env, "report.txt", "report", "--since", "1d", "--by", "model")
    assert MODEL in table
    assert "compiler-changed 2" in table
    assert "shapes-changed 1" in table

    upgraded_block = next(
        e for e in events if e.get("job_id") == "upgrade" and e.get("reason") == "compiler-changed"
    )
    variant = next(e for e in events if e.get("reason") == "shapes-changed")
    why = command(sandbox, env, "explain-upgrade.txt", "explain", upgraded_block["key"])
    assert why.splitlines()[0].startswith("compiled before under neuronx-cc 2.20.9961.0")
    assert "2.21.1.0" in why.splitlines()[0]
    assert "a compiler upgrade misses every graph" in why.splitlines()[0]
    why = command(sandbox, env, "explain-variant.txt", "explain", variant["key"])
    assert "instructions' shapes" in why.splitlines()[0]

    plan = command(sandbox, env, "report-upgrade.txt", "report", "upgrade", "--to-compiler", NEXT)
    assert namespace in plan
    plan_json = json.loads(
        command(
            sandbox,
            env,
            "report-upgrade.json",
            "report",
            "upgrade",
            "--to-compiler",
            NEXT,
            "--format",
            "json",
        )
    )
    assert STANDIN_VERSION not in json.dumps(plan_json["namespaces"][0].get("from", ""))
    assert json.dumps(plan_json).count(UPGRADED) >= 1
