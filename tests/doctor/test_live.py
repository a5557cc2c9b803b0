"""``neffcache doctor --live``: each stack installed compiles a tiny graph twice, each
time on a fresh L1, and the second run must be a hit from the server through the
stack's interception point.

The stand-ins play the stacks (tests/doctor/live_standins.py, named by
``NEFFCACHE_DOCTOR_LIVE_DRIVERS``): TorchNeuron, vLLM Neuron and
``torch_neuronx.trace`` run ``neuronx-cc`` by name (the shim), the stand-in
libneuronxla asks its persistent cache (the hook). Which stacks are installed is
planted as distribution metadata, as in test_stacks_hook_l1.py. Against a real
``neffcache serve``; each test in a namespace of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from doctor.doctor_harness import (
    doctor_env,
    installed,
    results,
    run_doctor,
    said,
    standin_libneuronxla_version,
)
from support.e2e import STANDINS, Server, search_path

from neffcache.client.doctor.live_drivers import graph_of

pytestmark = pytest.mark.e2e

DRIVERS = Path(__file__).resolve().parent / "live_standins.py"
# PyTorch, TorchNeuron, torch-xla and vLLM Neuron as the real drivers call them.
FRAMEWORKS = STANDINS / "frameworks"
TORCHNEURON = {"torch": "2.10.0", "torch_neuronx": "2.10.0.2.34.0"}
EVERY_STACK = {**TORCHNEURON, "vllm_neuron": "0.3.0"}
# The point that must serve each stack's second run, as its run-manifest line says it.
VIA = {
    "torchneuron": "wrapper",
    "vllm-neuron": "wrapper",
    "trace": "wrapper",
    "libneuronxla": "hook",
}


def live_env(tmp: Path, url: str, **extra: str | None) -> dict[str, str]:
    return doctor_env(tmp, url, NEFFCACHE_DOCTOR_LIVE_DRIVERS=str(DRIVERS), **extra)


def namespace() -> str:
    return f"doctor-live-{os.urandom(4).hex()}"


def compiles(run: dict[str, Any]) -> list[list[str]]:
    return [argv for argv in run["compiler_argv"] or [] if "compile" in argv]


def test_live_passes_and_every_second_run_is_a_server_hit(server: Server, tmp_path: Path) -> None:
    ns = namespace()
    env = live_env(
        tmp_path, server.cache_url(ns), PYTHONPATH=installed(tmp_path / "d", **EVERY_STACK)
    )
    report = tmp_path / "report.txt"
    done = run_doctor(env, "--live", "--json", "--report", str(report))
    assert done.code == 0, done.out + done.err
    checks = done.results()
    for stack, via in VIA.items():
        live = checks[f"live.{stack}"]
        assert live["status"] == "PASS", live
        point = "hook" if via == "hook" else "shim"
        assert f"then a hit from the server through the {point}" in live["evidence"]
        first, second = live["data"]["runs"]
        assert [(g["via"], g["result"], g["source"]) for g in second["graphs"]] == [
            (via, "hit", "server")
        ], second
        assert any(g["source"] == "compiler" for g in first["graphs"]), first
        # The real compiler compiled once, in the first run, with the stack's argv.
        assert len(compiles(first)) == 1, live["data"]
        assert compiles(second) == [], live["data"]
        assert compiles(first)[0][:2] == ["neuronx-cc", "compile"]
        entry = live["data"]["entry"]
        assert entry["model"] == "neffcache-doctor-live", entry
        assert entry["files"]["model.neff"] == 4096, entry
        assert "by the test drivers in" in said(live)

    # TorchNeuron's command (docs/neuron-sdk.md#torchneurons-compiler-call) reached the
    # real compiler as it gave it.
    torchneuron = compiles(checks["live.torchneuron"]["data"]["runs"][0])[0]
    assert torchneuron[3:9] == ["--framework", "XLA", "--target", "trn2", "--lnc", "2"]
    assert torchneuron[2].endswith("/module.mlir")
    assert "--logfile" in compiles(checks["live.vllm-neuron"]["data"]["runs"][0])[0]

    # The SDK's calls on the hook's cache, in order: a probe that misses, the entry
    # lock, the compiled entry written; the second run's probe is answered.
    first, second = checks["live.libneuronxla"]["data"]["runs"]
    calls = first["cache_calls"]
    assert calls[0] == "create_compile_cache", calls
    assert "exists(model.done)=False" in calls
    assert calls.index("exists(model.done)=False") < calls.index(
        "hlo_acquire_lock(model.hlo_module.pb)"
    )
    assert any(c.startswith("upload_") and "model.done" in c for c in calls), calls
    assert "exists(model.done)=True" in second["cache_calls"], second["cache_calls"]

    text = report.read_text()
    assert "real compiler argv (run 1): neuronx-cc compile" in text
    assert "cache calls (run 1): create_compile_cache, " in text
    assert "entry on the server: " in text
    document = json.loads(text.split("\nJSON\n", 1)[1])
    assert {r["id"] for r in document["results"]} >= {f"live.{s}" for s in VIA}


def test_without_the_shim_first_torchneuron_never_reaches_the_cache(
    server: Server, tmp_path: Path
) -> None:
    installed(tmp_path / "d", **TORCHNEURON)  # and no libneuronxla
    env = live_env(
        tmp_path,
        server.cache_url(namespace()),
        PYTHONPATH=str(tmp_path / "d"),
        PATH=search_path(STANDINS),
    )
    code, checks = results(env, "--only", "live")
    live = checks["live.torchneuron"]
    assert live["status"] == "FAIL", live
    assert "the compile never reached neffcache: the shim is not first on PATH" in live["evidence"]
    assert live["fix"] == 'export PATH="$(neffcache shim-dir):$PATH"'
    assert len(live["data"]["runs"]) == 1
    assert "real compiler argv (run 1): not recorded" in said(live)
    assert checks["live.vllm-neuron"]["status"] == "SKIP"
    assert code == 1


def test_a_graph_that_differs_between_runs_is_named_as_compiled_again(
    server: Server, tmp_path: Path
) -> None:
    installed(tmp_path / "d", vllm_neuron="0.3.0")  # vLLM Neuron alone
    env = live_env(
        tmp_path,
        server.cache_url(namespace()),
        PYTHONPATH=str(tmp_path / "d"),
        NEFFCACHE_LIVE_STANDIN_UNSTABLE="1",
    )
    code, checks = results(env, "--only", "live")
    live = checks["live.vllm-neuron"]
    assert live["status"] == "FAIL", live
    assert "the second run, on a fresh L1, compiled again" in live["evidence"]
    assert "its key differs from the first run's" in live["evidence"]
    assert [len(compiles(run)) for run in live["data"]["runs"]] == [1, 1]
    assert code == 1


def test_a_hook_stack_served_by_the_shim_is_a_warning(server: Server, tmp_path: Path) -> None:
    # libneuronxla's second run hands over another trace of the program: its stock
    # address differs, so the hook misses; the shim finds it by its canonical key.
    env = live_env(tmp_path, server.cache_url(namespace()), NEFFCACHE_LIVE_STANDIN_RETRACE="1")
    code, checks = results(env, "--only", "live")
    live = checks["live.libneuronxla"]
    assert live["status"] == "WARN", live
    assert "a server hit, but through the shim, not the hook" in live["evidence"]
    assert "--report FILE" in live["fix"]
    second = live["data"]["runs"][1]
    assert [(g["via"], g["source"]) for g in second["graphs"]] == [("wrapper", "server")]
    assert compiles(second) == []
    assert code == 0


def test_the_real_drivers_skip_where_their_stack_does_not_import(
    server: Server, tmp_path: Path
) -> None:
    # No NEFFCACHE_DOCTOR_LIVE_DRIVERS: the real stacks' drivers, and no torch here.
    env = doctor_env(
        tmp_path, server.cache_url(namespace()), PYTHONPATH=installed(tmp_path / "d", **TORCHNEURON)
    )
    code, checks = results(env, "--only", "live")
    for stack in ("torchneuron", "trace", "libneuronxla"):
        live = checks[f"live.{stack}"]
        assert live["status"] == "SKIP", live
        assert "cannot be driven here: import torch failed: ModuleNotFoundError" in live["evidence"]
    assert code == 0


def test_the_real_drivers_compile_through_each_stacks_public_api(
    server: Server, tmp_path: Path
) -> None:
    # No NEFFCACHE_DOCTOR_LIVE_DRIVERS: live_drivers.py, the code a trn host runs,
    # drives the stand-in frameworks, which compile as each stack does.
    pythonpath = installed(tmp_path / "d", **EVERY_STACK)
    env = doctor_env(
        tmp_path,
        server.cache_url(namespace()),
        PYTHONPATH=os.pathsep.join([str(FRAMEWORKS), pythonpath]),
    )
    code, checks = results(env, "--only", "live")
    calls = {
        "torchneuron": 'torch.compile(backend="neuron")',
        "vllm-neuron": 'torch.compile(backend="vllm_neuron")',
        "trace": "torch_neuronx.trace",
        "libneuronxla": "torch-xla (xm.mark_step)",
    }
    for stack, call in calls.items():
        live = checks[f"live.{stack}"]
        assert live["status"] == "PASS", live
        assert live["data"]["drivers"] == "neffcache", live["data"]
        assert "by the test drivers" not in said(live)
        length, scale = graph_of(live["data"]["seed"])
        assert f"driven: {call} of x * {scale!r} + 1 over {length} floats" in live["details"]
        first, second = live["data"]["runs"]
        assert any(g["source"] == "compiler" for g in first["graphs"]), first
        assert [(g["via"], g["source"]) for g in second["graphs"]] == [(VIA[stack], "server")], (
            second
        )
    # Each stack's compiler call, as the stand-in frameworks made it from the driver's.
    runs = {stack: checks[f"live.{stack}"]["data"]["runs"][0] for stack in calls}
    torchneuron = compiles(runs["torchneuron"])[0]
    assert torchneuron[3:10] == ["--framework", "XLA", "--target", "trn2", "--lnc", "2", "-O2"]
    assert "--logfile" in compiles(runs["vllm-neuron"])[0]
    # trace's compiler_workdir: the driver's "trace" folder in the run's directory.
    assert compiles(runs["trace"])[0][2].endswith("/work/trace/model")
    assert "exists(model.done)=False" in runs["libneuronxla"]["cache_calls"]
    assert code == 0


def test_an_unreachable_server_fails_at_once(tmp_path: Path, unused_port: int) -> None:
    url = f"neffcache+http://127.0.0.1:{unused_port}/team-a"
    env = live_env(tmp_path, url, PYTHONPATH=installed(tmp_path / "d", **TORCHNEURON))
    code, checks = results(env, "--only", "live")
    for stack in ("torchneuron", "trace", "libneuronxla"):
        live = checks[f"live.{stack}"]
        assert live["status"] == "FAIL", live
        assert "the server cannot be used" in live["evidence"]
        assert live["fix"] == "see server.reach"
        assert "runs" not in live["data"]  # nothing was compiled
    assert checks["live.vllm-neuron"]["status"] == "SKIP"
    assert code == 1


def test_the_deadline_read_only_and_bad_input(server: Server, tmp_path: Path) -> None:
    env = live_env(tmp_path, server.cache_url(namespace()))  # the stand-in libneuronxla
    code, checks = results(env, "--only", "live", "--live-deadline", "0.5")
    live = checks["live.libneuronxla"]
    assert live["status"] == "WARN", live
    # What it is, with its version as the probe read it (the stand-in's dist-info).
    version = standin_libneuronxla_version()
    assert live["evidence"].startswith(f"libneuronxla {version}: not run: "), live
    assert "not run: the --live deadline (0.5 s) had passed" in live["evidence"]
    assert "--live-deadline" in live["fix"]
    assert code == 0

    checks = results(env, "--only", "live", "--read-only")[1]
    assert checks["live.libneuronxla"]["status"] == "SKIP"
    assert "--read-only" in checks["live.libneuronxla"]["evidence"]

    for bad in ("0", "-3", "soon", "nan"):
        assert run_doctor(env, "--live", "--live-deadline", bad).code == 2
