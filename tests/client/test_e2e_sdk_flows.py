"""End to end: how real sessions reach libneuronxla's cache
(docs/neuron-sdk.md#the-libneuronxla-path-in-practice), black-box, each on two "hosts"
(two L1 directories) sharing one server.

* A script sets the cache URL after start-up (NxD Training exports it from its YAML in
  each worker and appends ``--verbose=35`` to ``NEURON_CC_FLAGS``; the SDK's caching
  page sets ``os.environ`` in the script), before or after ``import libneuronxla``:
  the installed ``.pth`` must have armed the hook anyway.
* An optimum-neuron session replaces ``create_compile_cache`` everywhere by a function
  that builds ``CompileCacheFs(url)`` itself: no stock cache may be built on the
  ``neffcache+`` URL; the shim on PATH serves the compiles.
* ``NEFFCACHE_URL`` overrides the SDK's location however the caller spells it
  (``file://``, a trailing slash, ``~``) when it passes ``cache_dir`` itself.
* ``neuron_parallel_compile`` (collect-and-compile) hands its pool the path the trial
  run logged: the URL (set by the training script alone) or L1's directory.

After every flow, no directory named after a ``neffcache+`` URL exists anywhere in the
sandbox (every working directory, L1, TMPDIR and work directory is inside it).

Readings these tests commit to (where the stacks' documentation is silent):

* In an optimum session the hook's server-backed cache is bypassed by design: the
  graphs land in the stock layout in ``NEFFCACHE_LOCAL_DIR``, and the second host's
  hits come from the shim.
* ``neuron_parallel_compile``'s pool inherits ``NEURON_EXTRACT_GRAPHS_ONLY=1``; its
  compiles reach the server under their Neuron address when the shim vouches for them
  (the shim is on PATH on the compiling host), so a second host with the hook alone
  compiles nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    STANDINS,
    VARIANT,
    Sandbox,
    Server,
    Training,
    read_run_manifest,
    read_training,
    reference_neff,
    stock_address,
)

pytestmark = pytest.mark.e2e

PARALLEL_COMPILE = STANDINS / "neuron_parallel_compile.py"
NAMES = (BLOCK_A, VARIANT)
SCHEME = "neffcache+"
PUBLISH_DEADLINE = 5.0


def assert_no_url_directories(root: Path) -> None:
    """Nothing under ``root`` is named after a neffcache URL (what a stock cache built
    on one makes: ``neffcache+http:/HOST:PORT/NS``)."""
    strays = [str(p) for p in root.rglob("*") if SCHEME in p.name]
    assert not strays, f"a neffcache+ URL was used as a directory: {strays}"


def assert_stock_entries(l1: Path, names: Sequence[str], neffs: Sequence[bytes]) -> None:
    for name, neff in zip(names, neffs, strict=True):
        entry = l1 / stock_address(name)
        assert (entry / "model.done").is_file(), f"no {entry}/model.done in L1"
        assert (entry / "model.neff").read_bytes() == neff


def server_hits(manifest: Path, count: int) -> None:
    records = read_run_manifest(manifest)
    assert len(records) == count, records
    assert all(r["result"] == "hit" and r["source"] == "server" for r in records), records


def train(sandbox: Sandbox, env: Mapping[str, str], names: Sequence[str], *extra: str) -> Training:
    out = sandbox.new_dir("neffs")
    done = sandbox.run(sandbox.train_argv(names, out, *extra), env, timeout=90)
    training = read_training(done, out, names)
    training.done.check()
    return training


def wait_published(server: Server, namespace: str, names: Sequence[str]) -> None:
    """Every graph's stock address is an alias on the server (publishes run in the
    background; allow a short deadline)."""
    deadline = time.monotonic() + PUBLISH_DEADLINE
    missing = list(names)
    while missing and time.monotonic() < deadline:
        missing = [n for n in missing if server.alias(namespace, stock_address(n)) is None]
        time.sleep(0.05)
    assert not missing, f"not published under their Neuron address: {missing}"


# --- the URL set after start-up -------------------------------------------------------


@pytest.mark.parametrize(
    "session",
    [
        ["--append-env", "NEURON_CC_FLAGS=--verbose=35"],
        ["--env-after-import"],
    ],
    ids=["nxd-before-import", "caching-page-after-import"],
)
def test_a_url_the_script_sets_is_served(
    server: Server, sandbox: Sandbox, session: list[str]
) -> None:
    url = server.cache_url(sandbox.namespace)
    script = ["--set-env", f"NEURON_COMPILE_CACHE_URL={url}", *session]
    manifest = sandbox.root / "host-b.jsonl"

    first = train(sandbox, sandbox.env(l1=sandbox.new_dir("l1"), hook=True), NAMES, *script)
    assert sandbox.compiles() == 2
    assert first.neffs == [reference_neff(name) for name in NAMES]
    assert_no_url_directories(sandbox.root)

    env = sandbox.env(
        l1=sandbox.new_dir("l1"), hook=True, extra={"NEFFCACHE_RUN_MANIFEST": str(manifest)}
    )
    second = train(sandbox, env, NAMES, *script)
    assert sandbox.compiles() == 2, "host B compiled: the hook was not armed"
    assert second.neffs == first.neffs
    server_hits(manifest, len(NAMES))
    assert_no_url_directories(sandbox.root)


# --- optimum-neuron's session ---------------------------------------------------------


@pytest.mark.parametrize("url_var", ["NEURON_COMPILE_CACHE_URL", "NEURON_CC_FLAGS"])
def test_an_optimum_session_builds_its_stock_cache_on_l1(
    server: Server, sandbox: Sandbox, url_var: str
) -> None:
    url = server.cache_url(sandbox.namespace)
    l1s = [sandbox.new_dir("l1"), sandbox.new_dir("l1")]
    runs = []
    for l1 in l1s:
        env = sandbox.env(l1=l1, url=url, url_var=url_var, hook=True, shim=True)
        runs.append(train(sandbox, env, NAMES, "--optimum-session"))
        assert sandbox.compiles() == 2, "the shim did not serve host B"
        assert_no_url_directories(sandbox.root)
    assert runs[0].neffs == runs[1].neffs == [reference_neff(name) for name in NAMES]
    for l1, run in zip(l1s, runs, strict=True):
        assert_stock_entries(l1, NAMES, run.neffs)


# --- NEFFCACHE_URL over the SDK's location, however spelled ---------------------------


@pytest.mark.parametrize("spelling", ["file-url-trailing-slash", "home"])
def test_neffcache_url_overrides_a_cache_dir_the_caller_spells_differently(
    server: Server, sandbox: Sandbox, spelling: str
) -> None:
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "host-b.jsonl"
    stock_dirs = []
    runs = []
    for host in ("a", "b"):
        home = sandbox.new_dir("home")
        stock = home / "neuron-cache"
        stock_dirs.append(stock)
        if spelling == "home":
            sdk = {"NEURON_CC_FLAGS": "--cache_dir=~/neuron-cache", "HOME": str(home)}
            caller = f"{stock}/"
        else:
            sdk = {"NEURON_COMPILE_CACHE_URL": f"file://{stock}/"}
            caller = str(stock)
        extra: dict[str, str | None] = {"NEFFCACHE_URL": url, **sdk}
        if host == "b":
            extra["NEFFCACHE_RUN_MANIFEST"] = str(manifest)
        env = sandbox.env(l1=sandbox.new_dir("l1"), hook=True, extra=extra)
        runs.append(train(sandbox, env, NAMES, "--cache-dir", caller))
        assert sandbox.compiles() == 2, f"host {host}: the SDK's own cache was used"
        assert_no_url_directories(sandbox.root)
    assert runs[0].neffs == runs[1].neffs == [reference_neff(name) for name in NAMES]
    server_hits(manifest, len(NAMES))
    for stock in stock_dirs:
        assert not stock.exists() or not any(stock.iterdir()), f"{stock} was written"


# --- neuron_parallel_compile's hand-off -----------------------------------------------


def parallel_compile(
    sandbox: Sandbox, env: Mapping[str, str], names: Sequence[str], *script: str
) -> dict[str, dict[str, Any]]:
    """``neuron_parallel_compile -- train_like.py ...`` (collect-and-compile)."""
    out = sandbox.new_dir("neffs")
    argv = [sys.executable, str(PARALLEL_COMPILE), "--num_parallel", "2"]
    argv += ["--workdir", str(sandbox.new_dir("parallel-compile-workdir")), "--"]
    argv += sandbox.train_argv(names, out, *script)
    done = sandbox.run(argv, env, timeout=90).check()
    assert "neffcache:" not in done.stderr, done.describe()
    summary: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return summary


@pytest.mark.parametrize("hand_off", ["url-set-by-the-script", "l1-path"])
def test_parallel_compile_hands_its_pool_neffcache_cache(
    server: Server, sandbox: Sandbox, hand_off: str
) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")
    if hand_off == "l1-path":
        env = sandbox.env(
            l1=l1, url=url, hook=True, shim=True, extra={"NEFFCACHE_STANDIN_PATH_LOG": "cache_path"}
        )
        script: list[str] = []
    else:  # the tool's own environment names no cache: only the trial run knows it
        env = sandbox.env(l1=l1, hook=True, shim=True)
        script = ["--set-env", f"NEURON_COMPILE_CACHE_URL={url}"]

    summary = parallel_compile(sandbox, env, NAMES, *script)
    assert sandbox.compiles() == 2, sandbox.invocations()
    assert set(summary) == {str(l1 / stock_address(n) / "model.hlo_module.pb") for n in NAMES}
    assert all(result["status"] for result in summary.values()), summary
    assert_stock_entries(l1, NAMES, [reference_neff(name) for name in NAMES])
    wait_published(server, sandbox.namespace, NAMES)
    assert_no_url_directories(sandbox.root)

    # Host B, the hook alone: every graph from the server by its Neuron address.
    manifest = sandbox.root / "host-b.jsonl"
    extra = {"NEFFCACHE_RUN_MANIFEST": str(manifest)}
    run = train(
        sandbox, sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True, extra=extra), NAMES
    )
    assert sandbox.compiles() == 2, "host B compiled: the pool's compiles were not published"
    assert run.neffs == [reference_neff(name) for name in NAMES]
    server_hits(manifest, len(NAMES))
    assert_no_url_directories(sandbox.root)
    assert os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY") is None  # nothing leaked here
