"""End to end: the compiler wrapper (interception point 2), black-box.

``neffcache wrap -- neuronx-cc compile ...`` (run as ``python -m neffcache.client.cli``)
and the ``neuronx-cc`` in ``neffcache shim-dir``, against a real ``neffcache serve``
and the stand-in compiler (tests/standins/neuronx-cc). See support/e2e.py for how
processes and environments are built.

Readings of the specification these tests commit to (beyond its letter):

* The wrapper's key is the ``key`` that ``neffcache key IN --target trn1 --
  --model-type=transformer`` prints for the same input with the same compiler on PATH:
  the miss is published under it (``GET /v1/ns/NS/entries/KEY``), the run manifest
  reports it, and a failure record is filed under it.
* On a miss the compiler's own stdout reaches the wrapper's stdout (``Compiler status
  PASS``), and the entry's ``model.neff`` file reference is exactly the NEFF's BLAKE3
  digest and size.
* A failed compile leaves a failure record on the server (protocol.md, "Failure
  records") with the compiler's exit code and log, is never published as an entry, and
  does not stop a later run from compiling, even with the SAME L1 directory.
* Pass-through of what the wrapper does not understand: stdout and exit code are
  identical to running the compiler directly, and its stderr reaches the caller (the
  wrapper may add to stderr, never remove).
* The cache URL's precedence is NEFFCACHE_URL > --cache_dir= in NEURON_CC_FLAGS >
  NEURON_COMPILE_CACHE_URL, decided before looking at the scheme: a plain directory in
  --cache_dir hides a neffcache+ NEURON_COMPILE_CACHE_URL (stock behaviour), while
  NEFFCACHE_URL overrides any --cache_dir. Stock behaviour writes nothing into
  NEFFCACHE_LOCAL_DIR.
* Run manifest: exactly one line per wrapper invocation, appended to the file; a miss
  has ``compile_seconds`` at least the compile's duration; the NEFF bytes are ``bytes``.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    COMPILER,
    NEFFCACHE,
    STANDIN_NEFF_SIZE,
    STANDIN_VERSION,
    VARIANT,
    Done,
    Sandbox,
    Server,
    blake3_hex,
    canonical_key,
    copy_compiler,
    read_run_manifest,
    reference_neff,
    search_path,
    shim_dir,
)

pytestmark = pytest.mark.e2e


def _out(sandbox: Sandbox) -> Path:
    return sandbox.new_dir("out") / "model.neff"


# --- hits and misses ------------------------------------------------------------------


def test_second_run_with_a_fresh_l1_is_a_server_hit(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    neff = reference_neff(BLOCK_A)

    first_out = _out(sandbox)
    first = sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_A, first_out)
    first.check()
    assert sandbox.compiles() == 1
    assert first_out.read_bytes() == neff
    assert "Compiler status PASS" in first.stdout

    entry = server.entry(sandbox.namespace, canonical_key(BLOCK_A))
    assert entry is not None, "the compiled NEFF was not published under its key"
    assert entry["files"]["model.neff"] == {"digest": blake3_hex(neff), "size": len(neff)}

    second_out = _out(sandbox)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_A, second_out).check()
    assert sandbox.compiles() == 1, "a server hit ran the compiler"
    assert second_out.read_bytes() == neff


def test_metadata_different_trace_hits_and_a_different_program_misses(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_A, _out(sandbox)).check()
    assert sandbox.compiles() == 1

    renamed = _out(sandbox)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_B, renamed).check()
    assert sandbox.compiles() == 1, "the same program traced with other metadata was compiled"
    # The cached NEFF is the one compiled for block_a: the same program.
    assert renamed.read_bytes() == reference_neff(BLOCK_A)

    variant = _out(sandbox)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), VARIANT, variant).check()
    assert sandbox.compiles() == 2, "a different program was served from the cache"
    assert variant.read_bytes() == reference_neff(VARIANT)


# --- pass-through ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--version"], 0),
        (["list-operators", "--framework=XLA"], 3),
        (["compile", "--framework=XLA", "--output", "x.neff"], 2),  # no input file
    ],
    ids=["version", "other-subcommand", "compile-without-input"],
)
def test_what_it_does_not_understand_passes_through(
    server: Server, sandbox: Sandbox, args: list[str], code: int
) -> None:
    env = sandbox.env(l1=sandbox.new_dir("l1"), url=server.cache_url(sandbox.namespace))
    cwd = sandbox.new_dir("cwd")
    direct = sandbox.run([str(COMPILER), *args], env, cwd=cwd)
    assert direct.returncode == code, direct.describe()  # the stand-in's documented codes
    before = sandbox.invocations()
    wrapped = sandbox.run([*NEFFCACHE, "wrap", "--", "neuronx-cc", *args], env, cwd=cwd)

    assert not wrapped.timed_out, wrapped.describe()
    assert wrapped.returncode == direct.returncode, wrapped.describe()
    assert wrapped.stdout == direct.stdout
    assert direct.stderr in wrapped.stderr
    new = sandbox.invocations()[len(before) :]
    passed = " ".join(["neuronx-cc", *args])
    if args == ["--version"]:
        assert passed in new
    else:
        assert new.count(passed) == 1, new


def test_shim_on_path_runs_the_real_compiler_after_it(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    env = sandbox.env(l1=sandbox.new_dir("l1"), url=url, shim=True)
    direct = sandbox.run([str(COMPILER), "--version"], sandbox.env(l1=sandbox.new_dir("l1")))
    version = sandbox.run(["neuronx-cc", "--version"], env).check()
    assert version.stdout == direct.check().stdout

    first_out = _out(sandbox)
    first = sandbox.wrap(env, BLOCK_A, first_out, via_shim=True).check()
    assert sandbox.compiles() == 1
    assert first_out.read_bytes() == reference_neff(BLOCK_A)
    assert "Compiler status PASS" in first.stdout

    # --output=PATH, as transformers-neuronx writes it
    # (docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs).
    fresh = sandbox.env(l1=sandbox.new_dir("l1"), url=url, shim=True)
    second_out = _out(sandbox)
    sandbox.wrap(fresh, BLOCK_B, second_out, via_shim=True, output_form="equals").check()
    assert sandbox.compiles() == 1
    assert second_out.read_bytes() == reference_neff(BLOCK_A)


def test_real_compiler_from_environment_wins_over_path(
    server: Server, sandbox: Sandbox, tmp_path: Path
) -> None:
    real = copy_compiler(tmp_path / "real-bin")
    decoy_log = tmp_path / "decoy.log"
    decoy = tmp_path / "decoy-bin" / "neuronx-cc"
    decoy.parent.mkdir()
    decoy.write_text(f'#!/bin/sh\necho "$@" >> "{decoy_log}"\nexit 99\n')
    decoy.chmod(decoy.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=server.cache_url(sandbox.namespace),
        real_compiler_on_path=False,
        extra={"NEFFCACHE_REAL_COMPILER": str(real)},
    )
    env["PATH"] = search_path(shim_dir(), decoy.parent)

    out = _out(sandbox)
    sandbox.wrap(env, BLOCK_A, out, via_shim=True).check()
    assert sandbox.compiles() == 1
    assert out.read_bytes() == reference_neff(BLOCK_A)
    version = sandbox.run([*NEFFCACHE, "wrap", "--", "neuronx-cc", "--version"], env).check()
    assert f"NeuronX Compiler version {STANDIN_VERSION}" in version.stdout
    assert not decoy_log.exists(), "the neuronx-cc on PATH ran instead of NEFFCACHE_REAL_COMPILER"


# --- failures -------------------------------------------------------------------------


def test_failed_compile_is_returned_and_not_replayed(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    l1 = sandbox.new_dir("l1")
    out = _out(sandbox)
    failing = sandbox.env(l1=l1, url=url, extra={"NEFFCACHE_STANDIN_FAIL": "1"})
    failed = sandbox.wrap(failing, BLOCK_A, out)
    assert failed.returncode == 70, failed.describe()
    assert "NCC_STANDIN001" in failed.stderr
    assert "Compiler status ERROR" in failed.stdout
    assert not out.exists()
    assert sandbox.compiles() == 1

    # The same L1 directory and server, the failure cleared: it compiles again.
    sandbox.wrap(sandbox.env(l1=l1, url=url), BLOCK_A, out).check()
    assert sandbox.compiles() == 2
    assert out.read_bytes() == reference_neff(BLOCK_A)

    # ... and that success, not the failure, is what the next host gets.
    elsewhere = _out(sandbox)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_A, elsewhere).check()
    assert sandbox.compiles() == 2
    assert elsewhere.read_bytes() == reference_neff(BLOCK_A)


def test_failed_compile_is_reported_to_the_server_as_a_failure_record(
    server: Server, sandbox: Sandbox
) -> None:
    env = sandbox.env(
        l1=sandbox.new_dir("l1"),
        url=server.cache_url(sandbox.namespace),
        extra={"NEFFCACHE_STANDIN_FAIL": "1"},
    )
    failed = sandbox.wrap(env, VARIANT, _out(sandbox))
    assert failed.returncode == 70, failed.describe()
    key = canonical_key(VARIANT)
    records = server.failures(sandbox.namespace, key)
    assert len(records) == 1, records
    assert records[0]["exit_code"] == 70
    assert records[0]["compiler_version"] == STANDIN_VERSION
    assert "NCC_STANDIN001" in records[0]["log"]
    assert server.entry(sandbox.namespace, key) is None, "a failure was published as an entry"


def served_bytes(server: Server) -> float:
    """The server's ``neffcache_blob_bytes_served_total``: blob GETs and NEFFs sent
    inline in lookups (docs/protocol.md#a-file-inline)."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    for line in metrics.splitlines():
        if line.startswith("neffcache_blob_bytes_served_total "):
            return float(line.split()[1])
    raise AssertionError("no neffcache_blob_bytes_served_total in /metrics")


def test_the_ranks_of_a_host_fetch_a_neff_once(server: Server, sandbox: Sandbox) -> None:
    url = server.cache_url(sandbox.namespace)
    sandbox.wrap(sandbox.env(l1=sandbox.new_dir("l1"), url=url), BLOCK_A, _out(sandbox)).check()
    host = sandbox.env(l1=sandbox.new_dir("l1"), url=url)  # a new host: its L1 is empty
    before = served_bytes(server)

    def rank(_: int) -> Path:
        out = _out(sandbox)
        sandbox.wrap(host, BLOCK_A, out).check()
        return out

    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(rank, range(4)))
    assert all(out.read_bytes() == reference_neff(BLOCK_A) for out in outs)
    assert sandbox.compiles() == 1
    # Each rank's lookup may bring the NEFF inline; one at a time per key on a host, the
    # others find it in L1 (session.py), so it crosses the network once.
    assert served_bytes(server) - before == len(reference_neff(BLOCK_A))


# --- run manifest ---------------------------------------------------------------------


def test_run_manifest_records_a_miss_a_server_hit_and_l1_hits(
    server: Server, sandbox: Sandbox
) -> None:
    url = server.cache_url(sandbox.namespace)
    manifest = sandbox.root / "run-manifest.jsonl"
    extra = {"NEFFCACHE_RUN_MANIFEST": str(manifest), "NEFFCACHE_STANDIN_DELAY": "0.3"}
    key = canonical_key(BLOCK_A)
    size = len(reference_neff(BLOCK_A))
    assert size == STANDIN_NEFF_SIZE

    sandbox.wrap(
        sandbox.env(l1=sandbox.new_dir("l1"), url=url, extra=extra), BLOCK_A, _out(sandbox)
    ).check()
    [miss] = read_run_manifest(manifest)
    assert miss["result"] == "miss"
    assert miss["source"] == "compiler"
    assert miss["key"] == key
    assert miss["compile_seconds"] is not None
    assert miss["compile_seconds"] >= 0.3
    assert miss["bytes"] == size

    l1 = sandbox.new_dir("l1")
    sandbox.wrap(sandbox.env(l1=l1, url=url, extra=extra), BLOCK_B, _out(sandbox)).check()
    records = read_run_manifest(manifest)
    assert len(records) == 2, "one line per wrapper run, appended"
    assert records[0] == miss
    assert records[1]["result"] == "hit"
    assert records[1]["source"] == "server"
    assert records[1]["key"] == key
    assert records[1]["bytes"] == size

    # The L1 that fetched it answers next, for the same trace and for the other one:
    # the local copy is consulted (by the canonical key) before the network.
    for name in (BLOCK_B, BLOCK_A):
        sandbox.wrap(sandbox.env(l1=l1, url=url, extra=extra), name, _out(sandbox)).check()
        records = read_run_manifest(manifest)
        assert records[-1]["result"] == "hit", name
        assert records[-1]["source"] == "l1", name
        assert records[-1]["key"] == key
        assert records[-1]["bytes"] == size
    assert len(records) == 4
    assert sandbox.compiles() == 1


# --- turning it on --------------------------------------------------------------------


def test_cache_url_precedence(server: Server, sandbox: Sandbox, tmp_path: Path) -> None:
    right = server.cache_url(sandbox.namespace)

    def wrong(n: int) -> str:
        return server.cache_url(f"{sandbox.namespace}-w{n}")

    plain = str(tmp_path / "stock-cache")
    # Seed the "right" namespace.
    seed = sandbox.env(l1=sandbox.new_dir("l1"), url=right, url_var="NEFFCACHE_URL")
    sandbox.wrap(seed, BLOCK_A, _out(sandbox)).check()
    assert sandbox.compiles() == 1

    # name -> (variables, whether the run must hit, whether neffcache is on at all)
    cases: dict[str, tuple[dict[str, str], bool, bool]] = {
        "compile-cache-url": ({"NEURON_COMPILE_CACHE_URL": right}, True, True),
        "cc-flags-cache-dir": ({"NEURON_CC_FLAGS": f"--cache_dir={right}"}, True, True),
        "cache-dir-beats-compile-cache-url": (
            {"NEURON_COMPILE_CACHE_URL": wrong(1), "NEURON_CC_FLAGS": f"--cache_dir={right}"},
            True,
            True,
        ),
        "cache-dir-beats-compile-cache-url-2": (
            {"NEURON_COMPILE_CACHE_URL": right, "NEURON_CC_FLAGS": f"--cache_dir={wrong(2)}"},
            False,
            True,
        ),
        "neffcache-url-beats-both": (
            {
                "NEFFCACHE_URL": right,
                "NEURON_CC_FLAGS": f"--cache_dir={wrong(3)}",
                "NEURON_COMPILE_CACHE_URL": wrong(3),
            },
            True,
            True,
        ),
        "neffcache-url-beats-cache-dir": (
            {"NEFFCACHE_URL": wrong(4), "NEURON_CC_FLAGS": f"--cache_dir={right}"},
            False,
            True,
        ),
        "neffcache-url-beats-plain-cache-dir": (
            {"NEFFCACHE_URL": right, "NEURON_CC_FLAGS": f"--cache_dir={plain}"},
            True,
            True,
        ),
        "plain-cache-dir-is-stock": (
            {"NEURON_COMPILE_CACHE_URL": right, "NEURON_CC_FLAGS": f"--cache_dir={plain}"},
            False,
            False,
        ),
        "s3-url-is-stock": ({"NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix"}, False, False),
    }

    def run_case(name: str) -> tuple[str, Path, Path, Done]:
        variables, _, _ = cases[name]
        l1 = sandbox.new_dir("l1")
        out = _out(sandbox)
        return name, l1, out, sandbox.wrap(sandbox.env(l1=l1, extra=variables), BLOCK_A, out)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run_case, cases))

    for name, l1, out, done in results:
        _, must_hit, neffcache_on = cases[name]
        assert done.returncode == 0, f"{name}: {done.describe()}"
        assert out.read_bytes() == reference_neff(BLOCK_A), name
        compiled = sandbox.compiles(mentioning=out)
        assert compiled == (0 if must_hit else 1), f"{name}: {compiled} compiles"
        if not neffcache_on:
            assert not l1.exists() or not any(l1.iterdir()), f"{name}: stock run wrote to L1"


def test_shim_dir_is_one_line_naming_an_executable_neuronx_cc() -> None:
    directory = shim_dir()
    assert directory.is_absolute()
    assert os.access(directory / "neuronx-cc", os.X_OK)
