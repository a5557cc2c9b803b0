"""Unit tests for ``neffcache wrap`` and ``neffcache shim-dir``
(``neffcache.client.cli._wrap_cmd``)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from neffcache.client.cli import main
from neffcache.client.cli._wrap_cmd import make_shim_dir
from neffcache.client.compiler import find_real_compiler, is_shim

_CLEARED = (
    "NEFFCACHE_URL",
    "NEURON_CC_FLAGS",
    "NEURON_COMPILE_CACHE_URL",
    "NEFFCACHE_IN_WRAPPER",
    "NEFFCACHE_REAL_COMPILER",
)


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(tmp_path / "l1"))


def fake_compiler(directory: Path, code: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "neuronx-cc"
    path.write_text(f'#!/bin/sh\necho "real compiler: $*"\nexit {code}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_make_shim_dir(tmp_path: Path) -> None:
    directory = make_shim_dir(tmp_path / "shim")
    script = directory / "neuronx-cc"
    assert directory == (tmp_path / "shim").absolute()
    assert is_shim(str(script))
    assert os.access(script, os.X_OK)
    before = script.stat()
    assert make_shim_dir(tmp_path / "shim") == directory  # the same script: not rewritten
    after = script.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(directory)) == ["neuronx-cc", "neuronx-cc.client"]


def test_the_shim_is_skipped_when_looking_for_the_real_compiler(tmp_path: Path) -> None:
    shim = make_shim_dir(tmp_path / "shim")
    real = fake_compiler(tmp_path / "bin", 0)
    assert find_real_compiler("neuronx-cc", None, f"{shim}{os.pathsep}{real.parent}") == str(real)


def test_the_shim_runs_the_real_compiler(tmp_path: Path) -> None:
    shim = make_shim_dir(tmp_path / "shim")
    real = fake_compiler(tmp_path / "bin", 4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEFFCACHE_", "NEURON_"))}
    env["PATH"] = os.pathsep.join([str(shim), str(real.parent), "/usr/bin", "/bin"])
    env["NEFFCACHE_LOCAL_DIR"] = str(tmp_path / "l1")
    done = subprocess.run(
        ["neuronx-cc", "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 4
    assert done.stdout == "real compiler: --version\n"


def test_shim_dir_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shim-dir", "--dir", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out == f"{(tmp_path / 'd').absolute()}\n"
    assert main(["shim-dir"]) == 0  # default: under NEFFCACHE_LOCAL_DIR
    default = tmp_path / "l1" / ".neffcache" / "shim"
    assert capsys.readouterr().out == f"{default}\n"
    assert is_shim(str(default / "neuronx-cc"))


def test_shim_dir_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["shim-dir", "--dir", str(blocker / "shim")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("neffcache shim-dir: error: cannot write the shim")
    assert len(err.splitlines()) == 1
    assert main(["shim-dir", "--dir", str(tmp_path / "d"), "--", "extra"]) == 2
    assert "unexpected arguments: extra" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", [["wrap", "--"], ["wrap"]])
def test_wrap_command_passes_through(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    prefix: list[str],
) -> None:
    real = fake_compiler(tmp_path / "bin", 6)
    monkeypatch.setenv("PATH", str(real.parent))
    assert main([*prefix, "neuronx-cc", "--version"]) == 6
    assert capfd.readouterr().out == "real compiler: --version\n"


def test_wrap_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wrap", "--"]) == 2
    assert "give the compiler command" in capsys.readouterr().err
