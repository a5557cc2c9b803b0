"""Unit tests for ``neffcache.client.compiler``: finding the real ``neuronx-cc`` behind
the shim, and the on-disk memo of its version (the stand-in compiler counts how often
it is asked)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from neffcache.client.compiler import (
    SHIM_MARK,
    compiler_version,
    find_real_compiler,
    is_shim,
)

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "neuronx-cc"
STANDIN_VERSION = "2.20.9961.0+0acef03a"


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def shim(directory: Path) -> Path:
    return executable(
        directory / "neuronx-cc",
        f"#!/usr/bin/env python3\n# {SHIM_MARK}; test\nraise SystemExit(9)\n",
    )


def real(directory: Path) -> Path:
    return executable(directory / "neuronx-cc", "#!/bin/sh\nexit 0\n")


# --- find_real_compiler ---------------------------------------------------------------


def test_is_shim(tmp_path: Path) -> None:
    assert is_shim(str(shim(tmp_path / "a")))
    assert not is_shim(str(real(tmp_path / "b")))
    assert not is_shim(str(tmp_path / "absent"))


def test_shims_on_path_are_skipped(tmp_path: Path) -> None:
    first, second = shim(tmp_path / "shim1"), shim(tmp_path / "shim2")
    compiler = real(tmp_path / "bin")
    path = os.pathsep.join(str(p.parent) for p in (first, second, compiler))
    assert find_real_compiler("neuronx-cc", None, path) == str(compiler)


def test_non_executable_and_missing_entries_are_skipped(tmp_path: Path) -> None:
    plain = tmp_path / "plain" / "neuronx-cc"
    plain.parent.mkdir()
    plain.write_text("#!/bin/sh\n")  # not executable
    compiler = real(tmp_path / "bin")
    path = os.pathsep.join([str(tmp_path / "nowhere"), str(plain.parent), str(compiler.parent)])
    assert find_real_compiler("neuronx-cc", None, path) == str(compiler)


def test_only_shims_is_none(tmp_path: Path) -> None:
    assert find_real_compiler("neuronx-cc", None, str(shim(tmp_path).parent)) is None
    assert find_real_compiler("neuronx-cc", None, None) is None
    assert find_real_compiler("neuronx-cc", None, "") is None


def test_the_configured_compiler_wins(tmp_path: Path) -> None:
    compiler = real(tmp_path / "bin")
    configured = real(tmp_path / "opt")
    found = find_real_compiler("neuronx-cc", str(configured), str(compiler.parent))
    assert found == str(configured)


def test_a_path_name_is_used_unless_it_is_a_shim(tmp_path: Path) -> None:
    compiler = real(tmp_path / "bin")
    assert find_real_compiler(str(compiler), None, "") == str(compiler)
    assert find_real_compiler(str(shim(tmp_path / "s")), None, str(compiler.parent)) is None


def test_a_configured_shim_is_not_the_real_compiler(tmp_path: Path) -> None:
    # NEFFCACHE_REAL_COMPILER=$(which neuronx-cc), taken after the shim went first on
    # PATH, would have the shim run itself without end.
    the_shim = shim(tmp_path / "shim")
    compiler = real(tmp_path / "bin")
    path = os.pathsep.join([str(the_shim.parent), str(compiler.parent)])
    assert find_real_compiler("neuronx-cc", str(the_shim), path) == str(compiler)
    assert find_real_compiler("neuronx-cc", str(the_shim), str(the_shim.parent)) is None


# --- compiler_version -----------------------------------------------------------------


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A private copy of the stand-in compiler (its mtime is the test's to change) and
    the file that counts its invocations."""
    copy = tmp_path / "bin" / "neuronx-cc"
    copy.parent.mkdir()
    shutil.copy2(STANDIN, copy)
    counter = tmp_path / "invocations"
    monkeypatch.setenv("NEFFCACHE_STANDIN_COUNTER", str(counter))
    for name in ("NEFFCACHE_STANDIN_VERSION", "NEFFCACHE_STANDIN_VERSION_STREAM"):
        monkeypatch.delenv(name, raising=False)
    return copy, counter


def invocations(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_version_is_asked_once_then_remembered(
    standin: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler, counter = standin
    memo = tmp_path / "l1" / ".neffcache"
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    assert invocations(counter) == 1
    assert counter.read_text().split() == ["neuronx-cc", "--version"]
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    assert invocations(counter) == 1
    stored = json.loads((memo / "compiler-versions.json").read_text())
    assert stored[os.path.realpath(compiler)]["version"] == STANDIN_VERSION

    # A reinstalled compiler (new mtime) is asked again, and its new answer kept.
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.21.1.0+deadbeef")
    st = compiler.stat()
    os.utime(compiler, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert compiler_version(str(compiler), memo) == "2.21.1.0+deadbeef"
    assert invocations(counter) == 2
    assert compiler_version(str(compiler), memo) == "2.21.1.0+deadbeef"
    assert invocations(counter) == 2


def test_version_on_stderr(
    standin: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler, _ = standin
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION_STREAM", "stderr")
    assert compiler_version(str(compiler), tmp_path / "memo") == STANDIN_VERSION


def test_a_symlink_shares_the_memo_of_its_target(
    standin: tuple[Path, Path], tmp_path: Path
) -> None:
    compiler, counter = standin
    link = tmp_path / "link" / "neuronx-cc"
    link.parent.mkdir()
    link.symlink_to(compiler)
    memo = tmp_path / "memo"
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    assert compiler_version(str(link), memo) == STANDIN_VERSION
    assert invocations(counter) == 1


def test_a_damaged_memo_is_asked_again(standin: tuple[Path, Path], tmp_path: Path) -> None:
    compiler, counter = standin
    memo = tmp_path / "memo"
    memo.mkdir()
    (memo / "compiler-versions.json").write_text("[not a dict")
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    (memo / "compiler-versions.json").write_text("[1, 2]")
    assert compiler_version(str(compiler), memo) == STANDIN_VERSION
    assert invocations(counter) == 2


def test_an_unwritable_memo_still_answers(standin: tuple[Path, Path], tmp_path: Path) -> None:
    compiler, counter = standin
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert compiler_version(str(compiler), blocker / "memo") == STANDIN_VERSION
    assert compiler_version(str(compiler), blocker / "memo") == STANDIN_VERSION
    assert invocations(counter) == 2  # slower, never wrong


@pytest.mark.parametrize(
    "script",
    [
        "#!/bin/sh\necho 'something else'\n",
        "#!/bin/sh\necho 'NeuronX Compiler version not-a-version'\n",
        "#!/bin/sh\nexit 3\n",
    ],
)
def test_no_version_is_none_and_not_remembered(tmp_path: Path, script: str) -> None:
    compiler = executable(tmp_path / "bin" / "neuronx-cc", script)
    memo = tmp_path / "memo"
    assert compiler_version(str(compiler), memo) is None
    assert not (memo / "compiler-versions.json").exists()


def test_a_missing_compiler_is_none(tmp_path: Path) -> None:
    assert compiler_version(str(tmp_path / "absent"), tmp_path / "memo") is None


def test_the_compiler_is_asked_with_the_recursion_guard(tmp_path: Path) -> None:
    seen = tmp_path / "env"
    compiler = executable(
        tmp_path / "bin" / "neuronx-cc",
        f'#!/bin/sh\necho "$NEFFCACHE_IN_WRAPPER" > {seen}\n'
        "echo 'NeuronX Compiler version 2.20.9961.0+0acef03a'\n",
    )
    assert compiler_version(str(compiler), tmp_path / "memo") == STANDIN_VERSION
    assert seen.read_text().strip() == "1"
