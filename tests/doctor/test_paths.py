"""Interpreters and PATH: the shim not first, no compiler behind it, a compiler of
another Python, two compiler versions, and a Python where the hook cannot arm."""

from __future__ import annotations

import os
import site
from pathlib import Path

import pytest
from doctor.doctor_harness import doctor_env, results, said
from support.e2e import COMPILER, STANDINS, search_path, shim_dir

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_shim_not_first_on_path(tmp_path: Path) -> None:
    env = doctor_env(tmp_path, PATH=search_path(STANDINS, shim_dir()))
    code, checks = results(env, "--only", "paths")
    shim = checks["paths.shim"]
    assert shim["status"] == "FAIL", shim
    assert f"the first neuronx-cc on PATH is {STANDINS}/neuronx-cc" in shim["evidence"]
    assert "skip the cache" in shim["evidence"]
    assert shim["fix"] == f'export PATH="{shim_dir()}:$PATH"'
    assert code == 1


def test_no_shim_on_path_at_all(tmp_path: Path) -> None:
    env = doctor_env(tmp_path, PATH=search_path(STANDINS))
    shim = results(env, "--only", "paths")[1]["paths.shim"]
    assert shim["status"] == "FAIL"
    assert "no neffcache shim on PATH" in shim["evidence"]
    assert shim["fix"] == 'export PATH="$(neffcache shim-dir):$PATH"'


def test_no_real_compiler_behind_the_shim(tmp_path: Path) -> None:
    env = doctor_env(tmp_path, PATH=search_path(shim_dir()))
    code, checks = results(env, "--only", "paths")
    compiler = checks["paths.compiler"]
    assert compiler["status"] == "FAIL", compiler
    assert "no real neuronx-cc behind the shim" in compiler["evidence"]
    assert "NEFFCACHE_REAL_COMPILER" in compiler["fix"]
    assert checks["paths.version"]["status"] == "FAIL"
    assert code == 1


def test_a_compiler_run_by_another_python(tmp_path: Path, other_python: Path) -> None:
    # The stand-in compiler, with the #! line of another environment's Python.
    text = COMPILER.read_text().split("\n", 1)[1]
    planted = script(tmp_path / "other-bin" / "neuronx-cc", f"#!{other_python}\n{text}")
    env = doctor_env(tmp_path, PATH=search_path(shim_dir(), planted.parent))
    code, checks = results(env, "--only", "paths")
    interpreters = checks["paths.interpreters"]
    assert interpreters["status"] == "WARN", interpreters
    prefix = str(other_python.parent.parent)
    assert f"neuronx-cc runs under {prefix}" in interpreters["evidence"]
    assert "run the tools of one environment" in interpreters["fix"]
    assert f"neuronx-cc ({planted})" in said(interpreters)
    # That compiler still answers its version: a warning, not a failure.
    assert checks["paths.version"]["status"] == "PASS"
    assert checks["paths.compiler"]["data"]["path"] == str(planted)
    assert code == 0


def test_compiler_versions_that_disagree(tmp_path: Path) -> None:
    # The training Python's neuronxcc is another build than the compiler on PATH.
    packages = tmp_path / "packages"
    script(packages / "neuronxcc" / "__init__.py", '__version__ = "2.21.5555.0+deadbeef"\n')
    env = doctor_env(tmp_path, PYTHONPATH=os.pathsep.join([str(STANDINS), str(packages)]))
    code, checks = results(env, "--only", "paths")
    version = checks["paths.version"]
    assert version["status"] == "WARN", version
    assert "neuronx-cc --version says 2.20.9961.0+0acef03a" in version["evidence"]
    assert "neuronxcc.__version__ is 2.21.5555.0+deadbeef" in version["evidence"]
    assert "install one neuronx-cc" in version["fix"]
    assert code == 0


def _hookless(tmp_path: Path, other_python: Path) -> dict[str, str]:
    """torchrun under another Python that imports neffcache from PYTHONPATH only: its
    .pth line never runs there, so the hook cannot arm."""
    script(tmp_path / "tools" / "torchrun", f"#!{other_python}\nprint('a stand-in torchrun')\n")
    path = [str(STANDINS), str(REPO / "keying"), str(REPO / "client"), *site.getsitepackages()]
    return doctor_env(
        tmp_path,
        "neffcache+http://127.0.0.1:9/team-a",
        PATH=search_path(shim_dir(), STANDINS, tmp_path / "tools"),
        PYTHONPATH=os.pathsep.join(path),
    )


def test_the_hook_not_armed_in_torchruns_python(tmp_path: Path, other_python: Path) -> None:
    code, checks = results(_hookless(tmp_path, other_python), "--only", "paths", "--only", "hook")
    prefix = str(other_python.parent.parent)
    armed = checks["hook.armed"]
    assert armed["status"] == "FAIL", armed
    assert "the hook is not armed in the Python of torchrun" in armed["evidence"]
    assert "pip install neffcache" in armed["fix"]
    loads = checks["paths.neffcache"]
    assert loads["status"] == "FAIL", loads
    assert f"({prefix}), but its .pth line did not run there" in loads["evidence"]
    assert loads["fix"] == f"pip install neffcache into {prefix}, which installs neffcache_hook.pth"
    assert checks["paths.interpreters"]["status"] == "WARN"
    assert code == 1
