"""End to end: ``neuron_parallel_compile`` with the persistent-cache hook on (locks,
``get_hlos``, ``try_lookup_for_compile`` and ``clear_locks`` keep working for it),
black-box.

Every child has a ``neffcache+`` URL in its environment, the stand-in ``libneuronxla``
on PYTHONPATH and its own ``NEFFCACHE_LOCAL_DIR``, so the installed ``.pth`` arms the
hook in the training-like script, in the stand-in ``neuron_parallel_compile`` and in the
small cache-API children below alike. The flow follows
docs/neuron-sdk.md#neuron_parallel_compile:

1. a trial run (``NEURON_EXTRACT_GRAPHS_ONLY=1``) writes the HLOs into L1 in the stock
   layout and compiles nothing;
2. the stand-in ``neuron_parallel_compile`` scans L1 with ``get_hlos``, takes each
   todo entry with ``try_lookup_for_compile`` / ``with entry:`` and compiles it; the
   hook publishes each finished entry (``model.done`` written) to the server;
3. a fresh host (a new, empty L1) running the real training compiles nothing.

And docs/neuron-sdk.md#per-entry-compile-lock: a stale stock entry lock (an empty
``model.hlo_module.pb.lock``, as a crashed compile leaves it) is reported as locked by
``get_hlos``, is skipped by parallel compile, is removed by ``clear_locks()`` and the
entry then compiles.

Readings of the specification these tests commit to (beyond its letter):

* The cache the hook hands out for the ``neffcache+`` URL is rooted at
  ``NEFFCACHE_LOCAL_DIR`` (its ``get_hlos`` paths are L1 paths), and is an instance of
  the SDK's ``CompileCache``.
* An extraction run publishes nothing (no ``model.done`` was written).
* A lock file without neffcache's pid in it (one the stock SDK left) is the SDK's
  business: the hook neither removes it nor compiles the entry behind it until
  ``clear_locks()`` has run.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    STANDIN_VERSION,
    STANDINS,
    VARIANT,
    Done,
    Sandbox,
    Server,
    blake3_hex,
    hlo,
    reference_neff,
    stock_address,
)

pytestmark = pytest.mark.e2e

PARALLEL_COMPILE = STANDINS / "neuron_parallel_compile.py"
VARIANT_DTYPE = "variant_dtype"
NAMES = (BLOCK_A, VARIANT, VARIANT_DTYPE)
HLO_FILE = "model.hlo_module.pb"
LOCK_FILE = HLO_FILE + ".lock"
# tests/standins/libneuronxla/neuron_cc_wrapper.py: what extraction returns as the NEFF.
EXTRACT_ONLY_PLACEHOLDER = b"NEFFCACHE-STANDIN-EXTRACT-ONLY-PLACEHOLDER\n"
# The flags the stand-in stores in compile_flags.json for train_like.py's graphs.
HASHED_FLAGS = ["--target=trn1", "--model-type=transformer"]
PUBLISH_DEADLINE = 5.0

# A child that uses the cache API the way neuron_parallel_compile and its clear-locks
# command do: the cache comes from the SDK's own URL resolution and create_compile_cache,
# which the hook must have replaced. Prints one JSON object per operation.
_CACHE_OPS = """\
import json, sys
import libneuronxla
from libneuronxla.neuron_cc_cache import CacheUrl, CompileCache, create_compile_cache

cache = create_compile_cache(CacheUrl.get_cache_url())
print(json.dumps({
    "type": type(cache).__name__,
    "is_compile_cache": isinstance(cache, CompileCache),
    "patched": getattr(create_compile_cache, "__neffcache_patched__", False),
    "top_level_patched": libneuronxla.create_compile_cache is create_compile_cache,
    "cache_path": cache.cache_path,
}), flush=True)
for op in sys.argv[1:]:
    if op == "get_hlos":
        todo, locked, done, failed = cache.get_hlos()
        print(json.dumps({"todo": todo, "locked": locked, "done": done, "failed": failed}),
              flush=True)
    elif op == "clear_locks":
        cache.clear_locks()
        print(json.dumps({"cleared": True}), flush=True)
    else:
        raise SystemExit(f"unknown op {op}")
"""


# --- helpers --------------------------------------------------------------------------


def _env(
    sandbox: Sandbox, l1: Path, url: str, extra: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    return sandbox.env(l1=l1, url=url, hook=True, extra=extra)


def _entry(l1: Path, name: str) -> Path:
    return l1 / stock_address(name)


def _module(name: str) -> str:
    """``MODULE_<key>+<flags8>``: the entry's key, in the compile's argv (the stand-in
    compiles ``<workdir>/model.<key>.hlo_module.pb``)."""
    return stock_address(name).split("/")[1]


def _hlo_path(l1: Path, name: str) -> str:
    return str(_entry(l1, name) / HLO_FILE)


def _extract(sandbox: Sandbox, l1: Path, url: str, names: Sequence[str]) -> None:
    """The trial run (docs/neuron-sdk.md#trial-run): nothing compiles, only placeholders
    come back."""
    before = sandbox.compiles()
    trial = sandbox.train(_env(sandbox, l1, url, {"NEURON_EXTRACT_GRAPHS_ONLY": "1"}), names)
    trial.done.check()
    assert sandbox.compiles() == before, "the extraction run compiled"
    assert trial.neffs == [EXTRACT_ONLY_PLACEHOLDER] * len(names), (
        "the extraction run returned something other than the stand-in's placeholders"
    )


def _assert_extracted(l1: Path, name: str) -> None:
    """An "Empty" entry (docs/neuron-sdk.md#entry-states) in the stock layout: HLO and
    flags, no result."""
    entry = _entry(l1, name)
    assert (entry / HLO_FILE).read_bytes() == hlo(name).read_bytes(), f"{entry}: wrong HLO"
    assert json.loads((entry / "compile_flags.json").read_text()) == HASHED_FLAGS
    for absent in ("model.done", "model.neff", "model.log", LOCK_FILE):
        assert not (entry / absent).exists(), f"{entry}/{absent} after extraction"


def _assert_compiled(l1: Path, name: str) -> bytes:
    entry = _entry(l1, name)
    assert (entry / "model.done").is_file(), f"no {entry}/model.done"
    assert (entry / "model.done").stat().st_size == 0
    assert not (entry / LOCK_FILE).exists(), f"{entry}/{LOCK_FILE} left behind"
    neff = (entry / "model.neff").read_bytes()
    assert neff == reference_neff(name), f"{entry}/model.neff is not {name}'s NEFF"
    return neff


def _module_dirs(l1: Path) -> set[str]:
    version_dir = l1 / f"neuronxcc-{STANDIN_VERSION}"
    if not version_dir.is_dir():
        return set()
    return {p.name for p in version_dir.iterdir() if p.is_dir()}


def _parallel_compile(
    sandbox: Sandbox, env: Mapping[str, str], *cache_url: str
) -> tuple[Done, dict[str, dict[str, Any]]]:
    """The stand-in ``neuron_parallel_compile`` (URL as its argument, or from the
    environment): the finished process and its JSON summary, by HLO path."""
    argv = [sys.executable, str(PARALLEL_COMPILE), *cache_url]
    argv += ["--workdir", str(sandbox.new_dir("parallel-compile-workdir"))]
    done = sandbox.run(argv, env, timeout=60)
    assert not done.timed_out, done.describe()
    # The client logs (to stderr, logging's last resort) every error it swallows.
    assert "neffcache:" not in done.stderr, done.describe()
    try:
        summary: dict[str, dict[str, Any]] = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"no JSON summary: {exc}\n{done.describe()}") from exc
    return done, summary


def _cache_ops(
    sandbox: Sandbox, env: Mapping[str, str], *ops: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run :data:`_CACHE_OPS` in a child; checks that the hook's cache, rooted in L1,
    is what ``create_compile_cache`` returned there."""
    done = sandbox.run([sys.executable, "-c", _CACHE_OPS, *ops], env, timeout=60).check()
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 + len(ops), done.describe()
    info, results = lines[0], lines[1:]
    assert info["patched"], f"create_compile_cache is the stock one in the child: {info}"
    assert info["top_level_patched"], f"libneuronxla.create_compile_cache not patched: {info}"
    assert info["type"] == "NeffcacheCompileCache", f"not the hook's cache: {info}"
    assert info["is_compile_cache"], f"the hook's cache is not a CompileCache: {info}"
    assert Path(info["cache_path"]) == Path(env["NEFFCACHE_LOCAL_DIR"]), info
    return info, results


def _wait_published(server: Server, namespace: str, names: Sequence[str]) -> None:
    """Every graph's stock address is an alias on the server (the hook publishes in the
    background, flushed at exit: allow a short deadline)."""
    deadline = time.monotonic() + PUBLISH_DEADLINE
    missing = list(names)
    while True:
        missing = [n for n in missing if server.alias(namespace, stock_address(n)) is None]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not missing, f"not published under their Neuron address: {missing}"


def _assert_published_neff(server: Server, namespace: str, name: str, neff: bytes) -> None:
    entry = server.alias(namespace, stock_address(name))
    assert entry is not None
    ref = entry["files"]["model.neff"]
    assert ref["digest"] == blake3_hex(neff), f"{name}: the server holds another NEFF"
    assert ref["size"] == len(neff)
    assert LOCK_FILE not in entry["files"], f"{name}: the entry lock was published"


# --- tests ----------------------------------------------------------------------------


def test_collect_parallel_compile_then_a_fresh_host_compiles_nothing(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")

    # 1. Trial run: HLOs into L1 in the stock layout, nothing compiled or published.
    _extract(sandbox, l1, url, NAMES)
    assert _module_dirs(l1) == {_module(n) for n in NAMES}
    for name in NAMES:
        _assert_extracted(l1, name)
        assert server.alias(sandbox.namespace, stock_address(name)) is None, (
            f"the extraction run published {name}"
        )
    _, (hlos,) = _cache_ops(sandbox, _env(sandbox, l1, url), "get_hlos")
    assert sorted(hlos["todo"]) == sorted(_hlo_path(l1, n) for n in NAMES), hlos
    assert hlos["locked"] == hlos["done"] == hlos["failed"] == [], hlos

    # 2. Parallel compile through the hook: one compile per graph, all published.
    done, summary = _parallel_compile(sandbox, _env(sandbox, l1, url), url)
    assert done.returncode == 0, done.describe()
    assert sandbox.compiles() == 3, sandbox.invocations()
    assert set(summary) == {_hlo_path(l1, n) for n in NAMES}, summary
    assert all(result["status"] for result in summary.values()), summary
    neffs = {name: _assert_compiled(l1, name) for name in NAMES}
    _wait_published(server, sandbox.namespace, NAMES)
    for name, neff in neffs.items():
        _assert_published_neff(server, sandbox.namespace, name, neff)

    # Once more: get_hlos sees them done and try_lookup_for_compile skips them.
    done, summary = _parallel_compile(sandbox, _env(sandbox, l1, url))
    assert done.returncode == 0, done.describe()
    assert summary == {}, summary
    assert sandbox.compiles() == 3, "parallel compile recompiled finished entries"

    # 3. A fresh host: empty L1, the real run (no extraction), served by the server.
    fresh = sandbox.new_dir("l1")
    run = sandbox.train(_env(sandbox, fresh, url), NAMES)
    run.done.check()
    assert sandbox.compiles() == 3, "the fresh host compiled"
    assert run.neffs == [neffs[name] for name in NAMES]
    for name in NAMES:
        _assert_compiled(fresh, name)


def test_stale_stock_lock_is_locked_then_cleared_then_compiled(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")
    names = (BLOCK_A, VARIANT)
    stuck = VARIANT
    _extract(sandbox, l1, url, names)
    for name in names:
        _assert_extracted(l1, name)
    # What a compile killed mid-run leaves (docs/neuron-sdk.md#per-entry-compile-lock): an
    # empty lock file.
    lock = _entry(l1, stuck) / LOCK_FILE
    lock.touch()

    # (a) get_hlos through the hook's cache reports it as locked.
    _, (hlos,) = _cache_ops(sandbox, _env(sandbox, l1, url), "get_hlos")
    assert hlos["locked"] == [_hlo_path(l1, stuck)], hlos
    assert hlos["todo"] == [_hlo_path(l1, BLOCK_A)], hlos
    assert hlos["done"] == hlos["failed"] == [], hlos

    # Parallel compile leaves a locked entry alone (the stock behaviour).
    done, summary = _parallel_compile(sandbox, _env(sandbox, l1, url))
    assert done.returncode == 0, done.describe()
    assert set(summary) == {_hlo_path(l1, BLOCK_A)}, summary
    assert sandbox.compiles() == 1, sandbox.invocations()
    _assert_compiled(l1, BLOCK_A)
    assert lock.exists(), "the stock lock vanished before clear_locks"
    assert not (_entry(l1, stuck) / "model.done").exists()
    assert sandbox.compiles(_module(stuck)) == 0

    # (b) clear_locks() on the hook's cache removes it; get_hlos then says todo.
    _, (cleared, after) = _cache_ops(sandbox, _env(sandbox, l1, url), "clear_locks", "get_hlos")
    assert cleared == {"cleared": True}
    assert not lock.exists(), "clear_locks() left the stale lock"
    assert after["todo"] == [_hlo_path(l1, stuck)], after
    assert after["locked"] == [], after
    assert after["done"] == [_hlo_path(l1, BLOCK_A)], after

    # (c) Parallel compile now compiles it, and the hook publishes it.
    done, summary = _parallel_compile(sandbox, _env(sandbox, l1, url))
    assert done.returncode == 0, done.describe()
    assert set(summary) == {_hlo_path(l1, stuck)}, summary
    assert summary[_hlo_path(l1, stuck)]["status"] is True, summary
    assert sandbox.compiles() == 2, sandbox.invocations()
    assert sandbox.compiles(_module(stuck)) == 1, sandbox.invocations()
    neff = _assert_compiled(l1, stuck)
    _wait_published(server, sandbox.namespace, names)
    _assert_published_neff(server, sandbox.namespace, stuck, neff)
