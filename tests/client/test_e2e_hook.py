"""End to end: the persistent-cache hook (interception point 1), black-box.

A training-like script (train_like.py) runs as its own process with the stand-in
``libneuronxla`` on PYTHONPATH and calls ``libneuronxla.neuron_xla_compile(...)`` per
graph; nothing in it mentions neffcache. The installed ``.pth`` file must arm the hook
by itself when a ``neffcache+`` URL is configured. Each run gets its own L1 directory
(``NEFFCACHE_LOCAL_DIR``), working directory and TMPDIR (so the stand-in's compile work
directories differ too).

The stand-in keys entries by the raw module bytes, so ``block_a`` and
``block_b_renamed`` (one program, two traces) have different stock addresses: the hook
alone hits by the stock address when the bytes are the same; for a different trace,
the hook plus the wrapper shim on PATH compile nothing (the wrapper gets the canonical
hit), in both orders of the stand-in's HLO write and ``model.done`` probe
(``NEFFCACHE_STANDIN_HLO_FIRST``).

Readings of the specification these tests commit to (beyond its letter):

* The hook publishes an entry under the stock Neuron address: after run 1,
  ``GET /v1/ns/NS/aliases/neuronxcc-<ver>/MODULE_<k>+<fh>`` answers 200.
* When the SDK writes the HLO into the entry before probing ``model.done``
  (``NEFFCACHE_STANDIN_HLO_FIRST=1``), the hook alone gets the canonical hit for a
  metadata-different trace (the entry's HLO is already in L1 when the SDK asks, for
  its direct or canonical key).
* A hit leaves the stock layout in L1: ``model.neff`` holding the NEFF and a 0-byte
  ``model.done`` (docs/neuron-sdk.md#entry-layout) under the stock address of the module
  the SDK asked for.
* The ``neffcache+`` URL is never used as a directory: nothing named ``neffcache*``
  appears in the working directory.
* Whichever variable carries the URL (``NEURON_COMPILE_CACHE_URL``, ``--cache_dir=`` in
  ``NEURON_CC_FLAGS``, or ``NEFFCACHE_URL`` alone), the L1 directory is
  ``NEFFCACHE_LOCAL_DIR``. To keep the suite fast, the activation variable is paired
  with the stand-in order in the hook-plus-shim test rather than crossed with it.
* Run manifest, hook alone: exactly one line per graph per run, with the graph's stock
  address as ``neuron_address``; a miss has a numeric ``compile_seconds``.
* With a plain directory as the cache URL, the hook changes nothing: the stock cache is
  written and read as before, and L1 stays empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    STANDIN_NEFF_SIZE,
    VARIANT,
    Sandbox,
    Server,
    read_run_manifest,
    reference_neff,
    stock_address,
)

pytestmark = pytest.mark.e2e


def assert_stock_entry(l1: Path, name: str, neff: bytes) -> None:
    entry = l1 / stock_address(name)
    assert (entry / "model.neff").is_file(), f"no {entry}/model.neff in L1"
    assert (entry / "model.neff").read_bytes() == neff
    assert (entry / "model.done").is_file(), f"no {entry}/model.done in L1"
    assert (entry / "model.done").stat().st_size == 0


def assert_url_not_used_as_a_directory(cwd: Path) -> None:
    strays = [p.name for p in cwd.iterdir() if p.name.startswith("neffcache")]
    assert not strays, f"the cache URL was used as a path: {strays}"


def by_address(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    addresses = [r["neuron_address"] for r in records]
    assert len(set(addresses)) == len(addresses), f"more than one line per graph: {records}"
    return {r["neuron_address"]: r for r in records}


@pytest.mark.parametrize("hlo_first", ["0", "1"], ids=["probe-first", "hlo-first"])
def test_hook_alone_second_run_hits_by_neuron_address(
    server: Server, sandbox: Sandbox, hlo_first: str
) -> None:
    url = server.cache_url(sandbox.namespace)
    names = [BLOCK_A, VARIANT]
    manifests = [sandbox.root / "manifest-1.jsonl", sandbox.root / "manifest-2.jsonl"]

    def env(l1: Path, manifest: Path) -> dict[str, str]:
        extra = {"NEFFCACHE_STANDIN_HLO_FIRST": hlo_first, "NEFFCACHE_RUN_MANIFEST": str(manifest)}
        return sandbox.env(l1=l1, url=url, hook=True, extra=extra)

    cwd = sandbox.new_dir("work")
    first = sandbox.train(env(sandbox.new_dir("l1"), manifests[0]), names, cwd=cwd)
    first.done.check()
    assert sandbox.compiles() == 2
    assert first.neffs == [reference_neff(name) for name in names]
    assert_url_not_used_as_a_directory(cwd)
    for name in names:
        assert server.alias(sandbox.namespace, stock_address(name)) is not None, (
            f"{name} was not published under its Neuron address"
        )

    l1 = sandbox.new_dir("l1")
    cwd = sandbox.new_dir("work")
    second = sandbox.train(env(l1, manifests[1]), names, cwd=cwd)
    second.done.check()
    assert sandbox.compiles() == 2, "the second run compiled"
    assert second.neffs == first.neffs
    for name, neff in zip(names, first.neffs, strict=True):
        assert_stock_entry(l1, name, neff)
    assert_url_not_used_as_a_directory(cwd)

    misses = by_address(read_run_manifest(manifests[0]))
    hits = by_address(read_run_manifest(manifests[1]))
    assert set(misses) == set(hits) == {stock_address(name) for name in names}
    for record in misses.values():
        assert record["result"] == "miss"
        assert record["source"] == "compiler"
        assert record["compile_seconds"] is not None
        assert record["bytes"] == STANDIN_NEFF_SIZE
    for record in hits.values():
        assert record["result"] == "hit"
        assert record["source"] == "server"
        assert record["bytes"] == STANDIN_NEFF_SIZE


def test_hook_alone_canonical_hit_when_the_hlo_comes_first(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    extra = {"NEFFCACHE_STANDIN_HLO_FIRST": "1"}
    first = sandbox.train(
        sandbox.env(l1=sandbox.new_dir("l1"), url=url, hook=True, extra=extra), [BLOCK_A]
    )
    first.done.check()
    assert sandbox.compiles() == 1

    l1 = sandbox.new_dir("l1")
    second = sandbox.train(sandbox.env(l1=l1, url=url, hook=True, extra=extra), [BLOCK_B])
    second.done.check()
    assert sandbox.compiles() == 1, "the hook saw the HLO and still missed the canonical key"
    assert second.neffs == first.neffs
    assert_stock_entry(l1, BLOCK_B, first.neffs[0])


@pytest.mark.parametrize(
    ("hlo_first", "url_var"),
    [("0", "NEURON_CC_FLAGS"), ("1", "NEFFCACHE_URL")],
    ids=["probe-first-cache-dir", "hlo-first-neffcache-url"],
)
def test_hook_and_shim_compile_nothing_for_a_metadata_different_trace(
    server: Server, sandbox: Sandbox, hlo_first: str, url_var: str
) -> None:
    url = server.cache_url(sandbox.namespace)

    def env(l1: Path) -> dict[str, str]:
        extra = {"NEFFCACHE_STANDIN_HLO_FIRST": hlo_first}
        return sandbox.env(l1=l1, url=url, url_var=url_var, hook=True, shim=True, extra=extra)

    cwd = sandbox.new_dir("work")
    first = sandbox.train(env(sandbox.new_dir("l1")), [BLOCK_A], cwd=cwd)
    first.done.check()
    assert sandbox.compiles() == 1
    assert first.neffs == [reference_neff(BLOCK_A)]
    assert_url_not_used_as_a_directory(cwd)

    l1 = sandbox.new_dir("l1")
    cwd = sandbox.new_dir("work")
    second = sandbox.train(env(l1), [BLOCK_B], cwd=cwd)
    second.done.check()
    assert sandbox.compiles() == 1, "a metadata-different trace of a cached program compiled"
    assert second.neffs == first.neffs
    assert_stock_entry(l1, BLOCK_B, first.neffs[0])
    assert_url_not_used_as_a_directory(cwd)


def test_plain_cache_url_leaves_the_stock_cache_alone(sandbox: Sandbox, tmp_path: Path) -> None:
    l1 = sandbox.new_dir("l1")
    stock = tmp_path / "stock-cache"

    def env(cache: Path) -> dict[str, str]:
        return sandbox.env(l1=l1, url=str(cache), hook=True)

    first = sandbox.train(env(stock), [BLOCK_A])
    first.done.check()
    assert sandbox.compiles() == 1
    assert first.neffs == [reference_neff(BLOCK_A)]
    assert_stock_entry(stock, BLOCK_A, reference_neff(BLOCK_A))

    sandbox.train(env(stock), [BLOCK_A]).done.check()
    assert sandbox.compiles() == 1, "the stock cache no longer hits with the hook installed"

    sandbox.train(env(tmp_path / "other-stock-cache"), [BLOCK_A]).done.check()
    assert sandbox.compiles() == 2, "a plain cache URL was served from somewhere else"
    assert not any(l1.iterdir()), "a run without a neffcache+ URL wrote into L1"
