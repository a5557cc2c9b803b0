"""A correct set-up passes: a real ``neffcache serve``, the shim first on PATH with the
stand-in compiler behind it, the stand-in libneuronxla importable, a writable L1."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor.doctor_harness import doctor_env, run_doctor, standin_libneuronxla_version
from support.e2e import Server

from neffcache.client.cli._doctor_cmd import _GROUPS
from neffcache.client.doctor.runner import GROUPS


@pytest.mark.e2e
def test_a_correct_set_up_passes_with_exit_0(server: Server, tmp_path: Path) -> None:
    env = doctor_env(tmp_path, server.cache_url("doctor-clean"))
    done = run_doctor(env, "--json")
    assert done.code == 0, done.out
    document = done.json()
    results = {r["id"]: r for r in document["results"]}
    failing = {i: r["evidence"] for i, r in results.items() if r["status"] == "FAIL"}
    assert failing == {}
    assert document["exit_code"] == 0
    assert sum(document["summary"].values()) == len(results)
    # Every interception point was really tried, not skipped.
    for check in ("config.url", "server.reach", "server.round-trip", "paths.shim"):
        assert results[check]["status"] == "PASS", results[check]
    for check in ("paths.compiler", "paths.version", "paths.neffcache", "hook.armed"):
        assert results[check]["status"] == "PASS", results[check]
    assert results["hook.patched"]["status"] == "PASS", results["hook.patched"]
    assert results["server.round-trip"]["data"]["write"] == "ok"
    assert results["paths.version"]["data"]["compiler"] == "2.20.9961.0+0acef03a"
    # The stand-in's surface: every method served; setup_args() as
    # docs/neuron-sdk.md#setup_args has it.
    surface = results["hook.surface"]
    assert surface["status"] == "PASS", surface
    assert surface["data"]["unserved"] == []
    assert surface["data"]["setup_args"] == "tuple(NeuronCCArgs, list, str)"
    # libneuronxla's version, as the probe reads it: importlib.metadata, in the
    # training Python, from the stand-in's dist-info.
    stack = results["stacks.libneuronxla"]
    assert stack["status"] == "PASS"
    version = standin_libneuronxla_version()
    assert stack["evidence"].startswith(f"libneuronxla {version}: "), stack
    assert stack["data"]["libneuronxla"] == version


@pytest.mark.e2e
def test_the_text_output_names_every_check_and_its_status(server: Server, tmp_path: Path) -> None:
    env = doctor_env(tmp_path, server.cache_url("doctor-text"))
    done = run_doctor(env, "--read-only")
    assert done.code == 0, done.out
    lines = done.out.splitlines()
    assert lines[0].startswith("neffcache doctor: neffcache ")
    for group in (g for g in GROUPS if g.default):  # the live group runs with --live
        assert group.title in lines
        for check in group.checks:
            assert any(f" {check.id} " in line for line in lines), check.id
    assert lines[-1].endswith("nothing fails (exit 0)")
    assert "read only (--read-only)" in done.out


def test_the_command_line_names_every_group() -> None:
    assert tuple(g.name for g in GROUPS) == _GROUPS


@pytest.mark.e2e
def test_bad_input_exits_2(tmp_path: Path) -> None:
    env = doctor_env(tmp_path)
    assert run_doctor(env, "--only", "nosuch").code == 2
    assert run_doctor(env, "--report", str(tmp_path / "no" / "such" / "dir" / "r.txt")).code == 2


def test_a_check_that_crashes_is_a_fail_with_its_one_line() -> None:
    from neffcache.client.doctor.context import Context
    from neffcache.client.doctor.model import Check, Result, Status
    from neffcache.client.doctor.runner import run_one

    def broken(ctx: Context) -> Result:
        raise KeyError("a field\nthe SDK lacks")

    outcome = run_one(Context({}), Check("hook.broken", "a broken check", broken))
    assert outcome.result.status is Status.FAIL
    assert outcome.result.evidence == "the check itself failed: KeyError: 'a field\\nthe SDK lacks'"
    assert "--report FILE" in outcome.result.fix
