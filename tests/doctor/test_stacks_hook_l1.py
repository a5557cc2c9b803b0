"""Stacks (planted as distribution metadata: the doctor reads versions, it never
imports a stack), the hook's view of libneuronxla's surface, and L1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from doctor.doctor_harness import doctor_env, installed, results, said
from support.e2e import STANDINS, search_path, shim_dir

pytestmark = pytest.mark.e2e

URL = "neffcache+http://127.0.0.1:9/team-a"  # port 9: nothing answers; no server needed


def test_torchneuron_without_the_shim_first(tmp_path: Path) -> None:
    path = installed(tmp_path / "dists", torch="2.10.0", torch_neuronx="2.10.0.2.34.0")
    env = doctor_env(tmp_path, URL, PYTHONPATH=path, PATH=search_path(STANDINS, shim_dir()))
    code, checks = results(env, "--only", "stacks")
    stack = checks["stacks.torch-neuronx"]
    assert stack["status"] == "FAIL", stack
    assert "(TorchNeuron, torch 2.10.0): served by the shim" in stack["evidence"]
    assert "the shim is not first on PATH" in stack["evidence"]
    assert stack["fix"] == 'export PATH="$(neffcache shim-dir):$PATH"'
    assert checks["stacks.vllm-neuron"]["status"] == "SKIP"
    assert code == 1


def test_torchneuron_traps(tmp_path: Path) -> None:
    path = installed(tmp_path / "dists", torch="2.10.0", torch_neuronx="2.10.0.2.34.0")
    env = doctor_env(
        tmp_path,
        None,
        PYTHONPATH=path,
        NEURON_CC_FLAGS=f"--cache_dir={URL}",
        TORCH_NEURONX_NEFF_CACHE_DIR="/fsx/shared/neff-cache",
    )
    code, checks = results(env, "--only", "stacks")
    stack = checks["stacks.torch-neuronx"]
    assert stack["status"] == "WARN", stack
    assert "--cache_dir is in NEURON_CC_FLAGS" in stack["evidence"]
    assert "move the URL to NEFFCACHE_URL" in stack["fix"]
    assert "is not keyed by the compiler version" in said(stack)
    assert "TORCH_NEURONX_NEFF_DISABLE_CACHE=1" in said(stack)
    assert code == 0


def test_torch_xla_era_and_optimum_with_the_url_in_the_sdks_variable(tmp_path: Path) -> None:
    path = installed(
        tmp_path / "dists", torch="2.9.1", torch_neuronx="2.9.0.2.31.0", optimum_neuron="0.4.1"
    )
    env = doctor_env(tmp_path, None, PYTHONPATH=path, NEURON_COMPILE_CACHE_URL=URL)
    checks = results(env, "--only", "stacks")[1]
    assert checks["stacks.torch-neuronx"]["status"] == "PASS", checks["stacks.torch-neuronx"]
    assert "(torch-xla era, torch 2.9.1): the hook and the shim" in said(
        checks["stacks.torch-neuronx"]
    )
    optimum = checks["stacks.optimum-neuron"]
    assert optimum["status"] == "WARN", optimum
    assert "the URL is in NEURON_COMPILE_CACHE_URL" in optimum["evidence"]
    assert "set the URL in NEFFCACHE_URL" in optimum["fix"]


def test_an_sdk_method_the_proxy_does_not_serve(tmp_path: Path) -> None:
    # The stand-in libneuronxla, with one more public method on its CompileCache: what
    # a real SDK with a method our stand-ins lack would look like.
    sdk = tmp_path / "sdk"
    shutil.copytree(STANDINS / "libneuronxla", sdk / "libneuronxla")
    with open(sdk / "libneuronxla" / "neuron_cc_cache.py", "a") as f:
        f.write("\n\ndef _prefetch(self, path):\n    return None\n\n")
        f.write("CompileCache.prefetch_entry = _prefetch\n")
    env = doctor_env(tmp_path, URL, PYTHONPATH=os.pathsep.join([str(sdk), str(STANDINS)]))
    code, checks = results(env, "--only", "hook")
    surface = checks["hook.surface"]
    assert surface["status"] == "WARN", surface
    assert "neither overrides nor delegates: prefetch_entry" in surface["evidence"]
    assert "setup_args() returns tuple(NeuronCCArgs, list, str)" in surface["evidence"]
    assert "--report FILE" in surface["fix"]
    assert surface["data"]["unserved"] == ["prefetch_entry"]
    assert checks["hook.patched"]["status"] == "PASS"
    assert code == 0


def test_an_l1_that_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # unwritable below it, even for root
    env = doctor_env(tmp_path, URL, NEFFCACHE_LOCAL_DIR=str(blocker / "l1"))
    code, checks = results(env, "--only", "l1")
    writable = checks["l1.writable"]
    assert writable["status"] == "FAIL", writable
    assert f"L1 {blocker}/l1 is not writable" in writable["evidence"]
    assert "set NEFFCACHE_LOCAL_DIR to a writable directory" in writable["fix"]
    assert code == 1


def test_l1_over_its_limit(tmp_path: Path) -> None:
    blob = tmp_path / "l1" / ".neffcache" / "blobs" / "ab" / ("ab" + "0" * 62)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 4096)
    env = doctor_env(tmp_path, URL, NEFFCACHE_LOCAL_MAX_SIZE="1K")
    checks = results(env, "--only", "l1")[1]
    size = checks["l1.size"]
    assert size["status"] == "WARN", size
    assert "L1 holds 4.0 KiB, over its 1.0 KiB limit" in size["evidence"]
    assert size["data"]["used_bytes"] == 4096
    assert checks["l1.writable"]["status"] == "PASS"
