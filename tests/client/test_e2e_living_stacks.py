"""End to end: the callers of the living Neuron stacks through the shim, black-box.

TorchNeuron, vLLM Neuron and ``torch_neuronx.trace``
(docs/neuron-sdk.md#the-sdk-in-late-2026-torchneuron-vllm-neuron) never go through
libneuronxla's cache: they run ``neuronx-cc`` from PATH. Here each is its stand-in
script (tests/standins/torchneuron_like.py, vllm_neuron_like.py, trace_like.py), run
with the ``neuronx-cc`` of ``neffcache shim-dir`` first on PATH and the stand-in
compiler after it, against a real ``neffcache serve``, with ``NEFFCACHE_URL`` set (how
users of these stacks turn neffcache on: the SDK variables belong to libneuronxla). See
support/e2e.py for how processes and environments are built.

A "host" is its own L1 (``NEFFCACHE_LOCAL_DIR``), its own working directory and its
own work directories (TorchNeuron's ``mkdtemp`` root, vLLM's work dir, trace's
workdir); hosts share only the server. A test's first host compiles, the next ones
fetch.

Readings of the specification these tests commit to:

* The key depends on what the compiler is given, never on where: TorchNeuron's fresh
  ``neuron_compile_XXXXXX`` directory, vLLM's work dir and ``--logfile``, trace's
  workdir all differ between hosts, and the second host hits with a NEFF byte-identical
  to the first host's (and to what the stand-in caller gets with no shim at all).
* Inputs are told by content: TorchNeuron's StableHLO bytecode (tests/fixtures/mlir/),
  a VHLO portable artifact and MLIR text (both keyed by their bytes: the same bytes
  hit), an HloModuleProto as ``module.hlo.pb`` or vLLM's ``graph.hlo``, trace's folder.
  The same bytes under another name are the same input.
* No false hit: every variation the stand-in compiler turns into another NEFF (another
  program: shape, dtype, op, constant, operand order, a callee's name, one element of a
  dense constant; ``-O1`` for ``-O2``, ``--lnc 1`` for ``--lnc 2``, another target;
  other weights beside a traced graph; another HLO program) compiles again, and so does
  another compiler version (an upgraded ``neuronx-cc``: another binary reporting
  another version). Each is then a hit on the next host: cached under its own key.
* The same program traced differently (one group of tests/fixtures/mlir/mlir.json:
  other files, names, locations, debug info stripped; or of
  tests/fixtures/hlo/jax.json for vLLM's ``graph.hlo``) hits.
* vLLM's ``--logfile`` exists after a hit, and mentions the cache.
* What the shim cannot key (random bytes, a path that does not exist, an empty file,
  an empty directory) runs the real compiler with the same argv: same exit code, same
  stdout, the compiler's stderr reaches the caller (the shim may add to stderr, as in
  test_e2e_wrapper.py, but never a traceback), and every host compiles.
* A failed compile reaches the caller as the compiler's exit code (70).
* libneuronxla's own options, appended by TorchNeuron from ``NEURON_CC_FLAGS``
  (``--cache_dir=neffcache+http://...``, ``--log_level=INFO``), never reach the real
  compiler (the stand-in refuses them, as without the shim), and the call is cached.
* An option repeated with the same value is cached; repeated with another value, the
  call passes through uncached (every host compiles).
* After every flow, nothing named ``neffcache+...`` exists under the sandbox (the URL
  is never taken for a directory), and the callers' working directories stay empty.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.e2e import (
    BLOCK_A,
    BLOCK_B,
    COMPILER,
    OTHER,
    STANDINS,
    TESTS,
    VARIANT,
    Done,
    Sandbox,
    Server,
    copy_compiler,
    hlo,
    read_run_manifest,
    search_path,
    shim_dir,
)

pytestmark = pytest.mark.e2e

TORCHNEURON = STANDINS / "torchneuron_like.py"
VLLM = STANDINS / "vllm_neuron_like.py"
TRACE = STANDINS / "trace_like.py"
MLIR_DIR = TESTS / "fixtures" / "mlir"
OTHER_VERSION = "2.21.4242.0+1a2b3c4d"
# docs/neuron-sdk.md#torchneurons-compiler-call: what TorchNeuron puts between the input
# and NEURON_CC_FLAGS.
TORCHNEURON_OPTIONS = [
    "--framework",
    "XLA",
    "--target",
    "trn2",
    "--lnc",
    "2",
    "-O2",
    "--model-type",
    "transformer",
    "--auto-cast=none",
]


# --- the MLIR fixtures ----------------------------------------------------------------


def _mlir_index() -> dict[str, dict[str, Any]]:
    """tests/fixtures/mlir/mlir.json's fixtures: name -> {"group", "how", "bytes"}."""
    index = json.loads((MLIR_DIR / "mlir.json").read_text())
    fixtures: dict[str, dict[str, Any]] = index["fixtures"]
    return fixtures


def mlir(name: str) -> Path:
    """A StableHLO bytecode fixture, checked against mlir.json."""
    path = MLIR_DIR / f"{name}.mlirbc"
    assert path.read_bytes()[:4] == b"ML\xefR", f"{path} is not MLIR bytecode"
    assert path.stat().st_size == _mlir_index()[name]["bytes"], path
    return path


def mlir_group(group: str) -> list[str]:
    """The fixtures of one group (the same program), in mlir.json's order."""
    return [name for name, fixture in _mlir_index().items() if fixture["group"] == group]


# group -> fixtures of other groups that differ from it by one thing.
NEAR_MISSES = {
    "block": [
        "variant_shape",
        "variant_dtype",
        "variant_op",
        "variant_constant",
        "variant_operand_order",
    ],
    "calls": ["calls_b_renamed_callee"],
    "dense_constant": ["dense_constant_changed"],
    "zoo": [],
}


# --- hosts ----------------------------------------------------------------------------


@dataclass
class Host:
    """One machine: an L1, a working directory, work directories."""

    sandbox: Sandbox
    name: str
    url: str | None
    shim: bool = True
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.l1 = self.sandbox.new_dir(f"{self.name}-l1")
        self.cwd = self.sandbox.new_dir(f"{self.name}-cwd")
        self.work = self.sandbox.new_dir(f"{self.name}-work")

    def env(self, **extra: str) -> dict[str, str]:
        return self.sandbox.env(
            l1=self.l1,
            url=self.url,
            url_var="NEFFCACHE_URL",
            shim=self.shim,
            extra={**self.extra, **extra},
        )

    def new_work(self, name: str) -> Path:
        path = self.work / f"{name}-{len(list(self.work.iterdir()))}"
        path.mkdir()
        return path

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> Done:
        return self.sandbox.run(argv, env or self.env(), cwd=self.cwd, timeout=120)

    # TorchNeuron (docs/neuron-sdk.md#torchneurons-compiler-call)

    def torchneuron(
        self, module: Path, *options: str, env: dict[str, str] | None = None
    ) -> tuple[Done, Path]:
        tmp_root = self.new_work("tmp")
        out = self.new_work("out") / "module.neff"
        argv = [
            sys.executable,
            str(TORCHNEURON),
            str(module),
            "--output-neff",
            str(out),
            "--tmp-root",
            str(tmp_root),
            *options,
        ]
        done = self.run(argv, env)
        assert list(tmp_root.iterdir()) == [], "TorchNeuron's temporary directory was left"
        return done, out

    # vLLM Neuron (docs/neuron-sdk.md#vllm-neuron)

    def vllm(
        self, graph: Path, *compiler_args: str, env: dict[str, str] | None = None
    ) -> tuple[Done, Path]:
        wd = self.new_work("vllm")
        argv = [sys.executable, str(VLLM), str(graph), "--work-dir", str(wd)]
        if compiler_args:
            argv += ["--", *compiler_args]
        return self.run(argv, env), wd

    # torch_neuronx.trace (docs/neuron-sdk.md#torch-neuronx-tracing)

    def trace(self, graph: Path, seed: int, env: dict[str, str] | None = None) -> tuple[Done, Path]:
        workdir = self.new_work("trace")
        argv = [
            sys.executable,
            str(TRACE),
            str(graph),
            "--workdir",
            str(workdir),
            "--weights-seed",
            str(seed),
        ]
        return self.run(argv, env), workdir / "graph.neff"


def _reference_host(sandbox: Sandbox) -> Host:
    """A host with no shim and no cache, counting its compiles apart: what each stand-in
    caller gets from the stand-in compiler alone."""
    counter = sandbox.root / "reference-invocations.log"
    return Host(
        sandbox, "reference", None, shim=False, extra={"NEFFCACHE_STANDIN_COUNTER": str(counter)}
    )


def _vllm_neff(done: Done) -> Path:
    summary: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return Path(summary["neff"])


def _manifest(sandbox: Sandbox) -> Path:
    return sandbox.root / "run-manifest.jsonl"


_seen_records: dict[Path, int] = {}


def _last_record(sandbox: Sandbox) -> dict[str, Any]:
    """The run manifest's last line, which must be new since the previous call."""
    path = _manifest(sandbox)
    records = read_run_manifest(path)
    assert len(records) > _seen_records.get(path, 0), "the last call wrote no manifest line"
    _seen_records[path] = len(records)
    return records[-1]


def _hosts(server: Server, sandbox: Sandbox, count: int, **extra: str) -> list[Host]:
    url = server.cache_url(sandbox.namespace)
    extra = {"NEFFCACHE_RUN_MANIFEST": str(_manifest(sandbox)), **extra}
    return [Host(sandbox, f"host{i}", url, extra=dict(extra)) for i in range(1, count + 1)]


def _assert_clean(sandbox: Sandbox, *hosts: Host) -> None:
    """No ``neffcache+...`` path under the sandbox; the callers' cwds are empty."""
    named = [str(p) for p in sandbox.root.rglob("*") if "neffcache+" in p.name]
    assert named == [], f"the cache URL was used as a path: {named}"
    for host in hosts:
        left = sorted(p.name for p in host.cwd.iterdir())
        assert left == [], f"{host.name}'s working directory holds {left}"


# --- the callers alone ----------------------------------------------------------------


def test_without_the_shim_every_call_compiles(server: Server, sandbox: Sandbox) -> None:
    """The baseline: the stand-in callers work, with NEFFCACHE_URL set and no shim on
    PATH each call compiles, and two hosts get the same NEFF."""
    url = server.cache_url(sandbox.namespace)
    hosts = [Host(sandbox, f"host{i}", url, shim=False) for i in (1, 2)]
    module = hlo(BLOCK_A)
    neffs: dict[str, list[bytes]] = {"torchneuron": [], "vllm": [], "trace": []}
    for host in hosts:
        done, out = host.torchneuron(mlir("block_a"))
        done.check()
        neffs["torchneuron"].append(out.read_bytes())
        done, _ = host.vllm(module)
        neffs["vllm"].append(_vllm_neff(done.check()).read_bytes())
        done, out = host.trace(module, 1)
        done.check()
        neffs["trace"].append(out.read_bytes())
    assert sandbox.compiles() == 6
    for caller, pair in neffs.items():
        assert pair[0] == pair[1], caller
    _assert_clean(sandbox, *hosts)


# --- TorchNeuron ----------------------------------------------------------------------


# name -> (module, options): the kinds of input TorchNeuron sends
# (docs/neuron-sdk.md#torchneurons-compiler-call).
TORCHNEURON_FORMS: dict[str, tuple[Callable[[], Path], tuple[str, ...]]] = {
    "stablehlo-bytecode": (lambda: mlir("block_a"), ()),
    # A portable artifact (VHLO): keyed by its bytes alone, still cached.
    "vhlo-bytecode": (lambda: mlir("vhlo_block"), ()),
    # MLIR's textual form: keyed by its bytes alone, still cached.
    "mlir-text": (lambda: MLIR_DIR / "block_a.mlir", ()),
    "hlo-pb": (lambda: hlo(BLOCK_A), ("--hlo-pb",)),
}


@pytest.mark.parametrize("form", list(TORCHNEURON_FORMS))
def test_torchneuron_second_host_hits(server: Server, sandbox: Sandbox, form: str) -> None:
    make_module, options = TORCHNEURON_FORMS[form]
    module = make_module()
    reference_done, reference = _reference_host(sandbox).torchneuron(module, *options)
    reference_done.check()
    first, second = _hosts(server, sandbox, 2)

    done, out = first.torchneuron(module, *options)
    done.check()
    assert sandbox.compiles() == 1
    assert out.read_bytes() == reference.read_bytes()
    miss = _last_record(sandbox)
    assert (miss["result"], miss["source"]) == ("miss", "compiler")

    done, out = second.torchneuron(module, *options)
    done.check()
    assert sandbox.compiles() == 1, "the second host compiled"
    assert out.read_bytes() == reference.read_bytes()
    hit = _last_record(sandbox)
    assert (hit["result"], hit["source"]) == ("hit", "server")
    assert len(read_run_manifest(_manifest(sandbox))) == 2
    _assert_clean(sandbox, first, second)


@pytest.mark.parametrize("group", list(NEAR_MISSES))
def test_torchneuron_same_program_hits_and_other_programs_compile(
    server: Server, sandbox: Sandbox, group: str
) -> None:
    """mlir.json: the fixtures of one group are one program traced differently (other
    files, names, locations, debug info stripped); a near miss is another program."""
    base, *same = mlir_group(group)
    near_misses = NEAR_MISSES[group]
    for name in near_misses:
        assert _mlir_index()[name]["group"] != group, name
    reference_host = _reference_host(sandbox)
    first, second, third = _hosts(server, sandbox, 3)

    done, out = first.torchneuron(mlir(base))
    done.check()
    assert sandbox.compiles() == 1
    base_neff = out.read_bytes()

    for name in same:
        done, out = second.torchneuron(mlir(name))
        done.check()
        assert sandbox.compiles() == 1, f"{name}, the same program as {base}, was compiled"
        assert out.read_bytes() == base_neff, name
        hit = _last_record(sandbox)
        assert hit["result"] == "hit", name

    for count, name in enumerate(near_misses, start=2):
        reference_done, reference = reference_host.torchneuron(mlir(name))
        reference_done.check()
        done, out = second.torchneuron(mlir(name))
        done.check()
        assert sandbox.compiles() == count, f"{name} was served {base}'s NEFF"
        assert out.read_bytes() == reference.read_bytes(), name
        assert _last_record(sandbox)["result"] == "miss", name
        # Kept under its own key: the next host gets it.
        done, out = third.torchneuron(mlir(name))
        done.check()
        assert sandbox.compiles() == count, f"{name}: the third host compiled"
        assert out.read_bytes() == reference.read_bytes(), name
    _assert_clean(sandbox, first, second, third)


def test_torchneuron_option_and_version_variations_compile_again(
    server: Server, sandbox: Sandbox, tmp_path: Path
) -> None:
    """Every variation is a miss on a host whose L1 and server hold the base entry, gets
    the NEFF the compiler makes of it, and is then a hit on a third host. The same bytes
    under another name (module.hlo.pb) are no variation: a hit."""
    module = mlir("block_a")
    reference_host = _reference_host(sandbox)
    first, second, third = _hosts(server, sandbox, 3)
    upgraded = copy_compiler(tmp_path / "neuronx-cc-upgraded")

    def upgraded_env(host: Host) -> dict[str, str]:
        env = host.env(NEFFCACHE_STANDIN_VERSION=OTHER_VERSION)
        env["PATH"] = search_path(*([shim_dir()] if host.shim else []), upgraded.parent)
        return env

    # name -> (caller options, env maker or None)
    variations: dict[str, tuple[tuple[str, ...], Any]] = {
        "-O1": (("--opt-level", "1"), None),
        "--lnc 1": (("--lnc", "1"), None),
        "--target trn3": (("--target", "trn3"), None),
        "another compiler version": ((), upgraded_env),
    }

    done, base = first.torchneuron(module)
    done.check()
    done, fetched = second.torchneuron(module)
    done.check()
    assert sandbox.compiles() == 1
    assert fetched.read_bytes() == base.read_bytes()
    done, renamed = second.torchneuron(module, "--hlo-pb")
    done.check()
    assert sandbox.compiles() == 1, "the same bytes named module.hlo.pb were compiled"
    assert renamed.read_bytes() == base.read_bytes()

    for name, (options, make_env) in variations.items():
        reference_done, reference = reference_host.torchneuron(
            module, *options, env=make_env(reference_host) if make_env else None
        )
        reference_done.check()
        before = sandbox.compiles()
        done, out = second.torchneuron(module, *options, env=make_env(second) if make_env else None)
        done.check()
        assert sandbox.compiles() == before + 1, f"{name}: served from the cache"
        assert out.read_bytes() == reference.read_bytes(), name
        record = _last_record(sandbox)
        assert (record["result"], record["source"]) == ("miss", "compiler"), name

        done, again = third.torchneuron(module, *options, env=make_env(third) if make_env else None)
        done.check()
        assert sandbox.compiles() == before + 1, f"{name}: the third host compiled"
        assert again.read_bytes() == reference.read_bytes(), name
    _assert_clean(sandbox, first, second, third)


@pytest.mark.parametrize("with_neffcache_url", [False, True], ids=["cc-flags-only", "both"])
def test_libneuronxla_options_in_neuron_cc_flags_are_stripped(
    server: Server, sandbox: Sandbox, with_neffcache_url: bool
) -> None:
    url = server.cache_url(sandbox.namespace)
    flags = f"--cache_dir={url} --log_level=INFO"
    module = hlo(BLOCK_A)
    reference_host = _reference_host(sandbox)
    reference_done, reference = reference_host.torchneuron(module, "--hlo-pb")
    reference_done.check()
    # Without the shim the stand-in compiler refuses them, as the caller passes them on.
    refused, _ = reference_host.torchneuron(
        module, "--hlo-pb", env=reference_host.env(NEURON_CC_FLAGS=flags)
    )
    assert refused.returncode == 2, refused.describe()
    assert "--cache_dir" in refused.stderr

    hosts = _hosts(server, sandbox, 2, NEURON_CC_FLAGS=flags)
    if not with_neffcache_url:
        for host in hosts:
            host.url = None  # the URL only in NEURON_CC_FLAGS
    first, second = hosts
    done, out = first.torchneuron(module, "--hlo-pb")
    done.check()
    assert sandbox.compiles() == 1
    assert out.read_bytes() == reference.read_bytes()
    [compile_line] = [line for line in sandbox.invocations() if " compile " in line]
    assert "--cache_dir" not in compile_line
    assert "--log_level" not in compile_line
    assert "--model-type transformer" in compile_line

    done, out = second.torchneuron(module, "--hlo-pb")
    done.check()
    assert sandbox.compiles() == 1, "the second host compiled"
    assert out.read_bytes() == reference.read_bytes()
    assert _last_record(sandbox)["result"] == "hit"
    _assert_clean(sandbox, first, second)


@pytest.mark.parametrize(
    ("neuron_cc_flags", "cached"),
    [
        ("--target trn2", True),
        ("--lnc 2 -O2", True),
        ("--verbose=35 --verbose INFO", True),
        ("--lnc 1", False),
        ("--target trn3", False),
    ],
    ids=["same-target", "same-lnc-and-O2", "verbose-twice", "other-lnc", "other-target"],
)
def test_repeated_options(
    server: Server, sandbox: Sandbox, neuron_cc_flags: str, cached: bool
) -> None:
    """TorchNeuron appends NEURON_CC_FLAGS after its own options: an option given twice
    with the same value is cached; with two values, the shim leaves it to the compiler."""
    module = hlo(BLOCK_A)
    reference_host = _reference_host(sandbox)
    reference_done, reference = reference_host.torchneuron(
        module, "--hlo-pb", env=reference_host.env(NEURON_CC_FLAGS=neuron_cc_flags)
    )
    reference_done.check()
    first, second = _hosts(server, sandbox, 2, NEURON_CC_FLAGS=neuron_cc_flags)
    for i, host in enumerate((first, second)):
        done, out = host.torchneuron(module, "--hlo-pb")
        done.check()
        assert out.read_bytes() == reference.read_bytes()
        assert sandbox.compiles() == (1 if cached else i + 1)
    _assert_clean(sandbox, first, second)


# --- vLLM Neuron ----------------------------------------------------------------------


def test_vllm_second_host_hits_and_other_programs_compile(server: Server, sandbox: Sandbox) -> None:
    reference_host = _reference_host(sandbox)
    references: dict[str, bytes] = {}
    for name in (BLOCK_A, VARIANT, OTHER):
        done, _ = reference_host.vllm(hlo(name))
        references[name] = _vllm_neff(done.check()).read_bytes()
    first, second = _hosts(server, sandbox, 2)

    done, wd = first.vllm(hlo(BLOCK_A))
    done.check()
    assert sandbox.compiles() == 1
    assert _vllm_neff(done).read_bytes() == references[BLOCK_A]
    assert "Compiler status PASS" in (wd / "log-neuron-cc.txt").read_text()
    assert _last_record(sandbox)["result"] == "miss"

    done, wd = second.vllm(hlo(BLOCK_A))
    done.check()  # the caller itself checks that the NEFF and the log file exist
    assert sandbox.compiles() == 1, "the second host compiled"
    assert _vllm_neff(done).read_bytes() == references[BLOCK_A]
    log = (wd / "log-neuron-cc.txt").read_text()
    assert "cache" in log.lower(), (
        f"the log file does not say the NEFF came from the cache: {log!r}"
    )
    hit = _last_record(sandbox)
    assert (hit["result"], hit["source"]) == ("hit", "server")

    # The same program traced from another file, under other names: a hit.
    done, wd = second.vllm(hlo(BLOCK_B))
    done.check()
    assert sandbox.compiles() == 1, "the same program traced elsewhere was compiled"
    assert _vllm_neff(done).read_bytes() == references[BLOCK_A]
    assert (wd / "log-neuron-cc.txt").exists()

    for count, name in enumerate((VARIANT, OTHER), start=2):
        done, wd = second.vllm(hlo(name))
        done.check()
        assert sandbox.compiles() == count, f"{name} was served from the cache"
        assert _vllm_neff(done).read_bytes() == references[name]
        assert "Compiler status PASS" in (wd / "log-neuron-cc.txt").read_text()
    _assert_clean(sandbox, first, second)


# --- torch_neuronx.trace --------------------------------------------------------------


def test_trace_other_weights_compile_again(server: Server, sandbox: Sandbox) -> None:
    reference_host = _reference_host(sandbox)
    references: dict[tuple[str, int], bytes] = {}
    for name, seed in ((BLOCK_A, 1), (BLOCK_A, 2), (VARIANT, 1)):
        done, out = reference_host.trace(hlo(name), seed)
        done.check()
        references[name, seed] = out.read_bytes()
    assert len(set(references.values())) == 3
    first, second, third = _hosts(server, sandbox, 3)

    done, out = first.trace(hlo(BLOCK_A), 1)
    done.check()
    assert sandbox.compiles() == 1
    assert out.read_bytes() == references[BLOCK_A, 1]

    done, out = second.trace(hlo(BLOCK_A), 1)
    done.check()
    assert sandbox.compiles() == 1, "the second host compiled"
    assert out.read_bytes() == references[BLOCK_A, 1]
    hit = _last_record(sandbox)
    assert (hit["result"], hit["source"]) == ("hit", "server")

    done, out = second.trace(hlo(BLOCK_A), 2)
    done.check()
    assert sandbox.compiles() == 2, "other weights were served the NEFF of the first"
    assert out.read_bytes() == references[BLOCK_A, 2]

    done, out = second.trace(hlo(VARIANT), 1)
    done.check()
    assert sandbox.compiles() == 3, "another graph with the same weights was served"
    assert out.read_bytes() == references[VARIANT, 1]

    done, out = third.trace(hlo(BLOCK_A), 2)
    done.check()
    assert sandbox.compiles() == 3, "the third host compiled"
    assert out.read_bytes() == references[BLOCK_A, 2]
    _assert_clean(sandbox, first, second, third)


# --- what the shim cannot key, and failures -------------------------------------------


def _random_bytes() -> bytes:
    # 0x07: field 0 with wire type 7, which no protobuf message can start with.
    return b"\x07" + random.Random(20261130).randbytes(4095)


@pytest.mark.parametrize("case", ["random-bytes", "missing-path", "empty-file", "empty-directory"])
def test_inputs_the_shim_cannot_key_behave_as_the_compiler_alone(
    server: Server, sandbox: Sandbox, case: str
) -> None:
    inputs = sandbox.new_dir("inputs")
    module = inputs / "module.mlir"
    if case == "random-bytes":
        module.write_bytes(_random_bytes())
    elif case == "empty-file":
        module.write_bytes(b"")
    elif case == "empty-directory":
        module = inputs / "model"
        (module / "weights").mkdir(parents=True)
    out_dir = sandbox.new_dir("out")
    out = out_dir / "module.neff"
    argv = ["compile", str(module), *TORCHNEURON_OPTIONS, "--output", str(out)]
    first, second = _hosts(server, sandbox, 2)

    direct = first.run([str(COMPILER), *argv], first.env())
    direct_neff = out.read_bytes() if out.exists() else None
    expected_code = 0 if case == "random-bytes" else 2
    assert direct.returncode == expected_code, direct.describe()
    assert sandbox.compiles() == 1
    direct_line = sandbox.invocations()[-1]

    for count, host in enumerate((first, second), start=2):
        if out.exists():
            out.unlink()
        shimmed = host.run(["neuronx-cc", *argv])
        assert not shimmed.timed_out, shimmed.describe()
        assert shimmed.returncode == direct.returncode, shimmed.describe()
        assert shimmed.stdout == direct.stdout
        assert direct.stderr in shimmed.stderr
        assert "Traceback" not in shimmed.stderr
        assert sandbox.compiles() == count, "the real compiler did not run (or was cached)"
        compile_lines = [line for line in sandbox.invocations() if " compile " in line]
        assert compile_lines[-1] == direct_line, "the real compiler got another argv"
        assert (out.read_bytes() if out.exists() else None) == direct_neff
    _assert_clean(sandbox, first, second)


def test_failing_compile_exits_with_the_compilers_code(server: Server, sandbox: Sandbox) -> None:
    first, second = _hosts(server, sandbox, 2)
    failing = {"NEFFCACHE_STANDIN_FAIL": "1"}

    done, out = first.torchneuron(hlo(BLOCK_A), "--hlo-pb", env=first.env(**failing))
    assert done.returncode == 70, done.describe()
    assert "NCC_STANDIN001" in done.stderr
    assert not out.exists()
    assert sandbox.compiles() == 1

    done, _ = first.vllm(hlo(BLOCK_A), env=first.env(**failing))
    assert done.returncode == 70, done.describe()
    assert "NCC_STANDIN001" in done.stderr
    assert sandbox.compiles() == 2

    done, out = first.trace(hlo(BLOCK_A), 1, env=first.env(**failing))
    assert done.returncode == 70, done.describe()
    assert not out.exists()
    assert sandbox.compiles() == 3

    # The failure is not served as a NEFF: with the failure cleared, the next host compiles.
    done, out = second.torchneuron(hlo(BLOCK_A), "--hlo-pb")
    done.check()
    assert sandbox.compiles() == 4
    assert out.read_bytes().startswith(b"STANDIN-NEFF\n")
    _assert_clean(sandbox, first, second)


def test_shim_is_first_on_path_for_the_callers(sandbox: Sandbox) -> None:
    """The premise: with the shim directory first, the callers' PATH lookup finds it."""
    host = Host(sandbox, "host", None)
    env = host.env()
    first = next(
        Path(d) / "neuronx-cc"
        for d in env["PATH"].split(os.pathsep)
        if (Path(d) / "neuronx-cc").exists()
    )
    assert first == shim_dir() / "neuronx-cc"
