"""compiler_version: ask ``neuronx-cc --version``
(docs/neuron-sdk.md#neuronx-cc-version-output) once per binary.

Uses the stand-in at tests/standins/neuronx-cc, not the real compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.keying import KeyingError, _compiler, check_compiler_version, compiler_version

STANDIN = Path(__file__).resolve().parent.parent / "standins" / "neuronx-cc"
DEFAULT_VERSION = "2.20.9961.0+0acef03a"


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NEFFCACHE_STANDIN_VERSION", raising=False)
    monkeypatch.delenv("NEFFCACHE_STANDIN_VERSION_STREAM", raising=False)
    monkeypatch.delenv("NEFFCACHE_STANDIN_COUNTER", raising=False)
    _compiler._cache.clear()
    yield
    _compiler._cache.clear()


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH; python3 stays reachable for the stand-in's shebang."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", os.pathsep.join([str(directory), str(Path(sys.executable).parent)]))
    return directory


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "invocations"
    monkeypatch.setenv("NEFFCACHE_STANDIN_COUNTER", str(path))
    return path


def invocations(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def install_copy(bin_dir: Path) -> Path:
    target = bin_dir / "neuronx-cc"
    shutil.copy2(STANDIN, target)
    return target


def write_script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(0o755)
    return path


def test_standin_is_executable() -> None:
    assert os.access(STANDIN, os.X_OK)
    assert STANDIN.read_text().startswith("#!/usr/bin/env python3\n")


def test_finds_compiler_on_path(bin_dir: Path) -> None:
    (bin_dir / "neuronx-cc").symlink_to(STANDIN)
    assert compiler_version() == DEFAULT_VERSION


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_reads_version_from_either_stream(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, stream: str
) -> None:
    install_copy(bin_dir)
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION_STREAM", stream)
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.25.3371.0+f524f7f8")
    assert compiler_version() == "2.25.3371.0+f524f7f8"


def test_reads_old_nine_hex_build(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_copy(bin_dir)
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.1.0.76+2909d26a2")
    assert compiler_version() == "2.1.0.76+2909d26a2"


def test_memoizes_per_binary(bin_dir: Path, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_copy(bin_dir)
    assert compiler_version() == DEFAULT_VERSION
    # The binary did not change, so its answer is reused even though the stand-in
    # would now say something else.
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.99.0.0+deadbeef")
    assert compiler_version() == DEFAULT_VERSION
    assert invocations(counter) == 1


def test_asks_again_after_reinstall(bin_dir: Path, counter: Path) -> None:
    compiler = bin_dir / "neuronx-cc"

    def install(version: str, mtime_ns: int) -> None:
        write_script(
            compiler,
            f"#!/bin/sh\nNEFFCACHE_STANDIN_VERSION={version} "
            f'exec {sys.executable} {STANDIN} "$@"\n',
        )
        os.utime(compiler, ns=(mtime_ns, mtime_ns))

    install("2.20.9961.0+0acef03a", 1_700_000_000_000_000_000)
    assert compiler_version() == "2.20.9961.0+0acef03a"
    assert compiler_version() == "2.20.9961.0+0acef03a"
    assert invocations(counter) == 1

    install("2.21.1234.0+aaaaaaaa", 1_700_000_100_000_000_000)
    assert compiler_version() == "2.21.1234.0+aaaaaaaa"
    assert compiler_version() == "2.21.1234.0+aaaaaaaa"
    assert invocations(counter) == 2


def test_explicit_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    compiler = install_copy(tmp_path)
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.26.6360.0+6f180f47")
    assert compiler_version(str(compiler)) == "2.26.6360.0+6f180f47"


def test_explicit_name_on_path(bin_dir: Path) -> None:
    shutil.copy2(STANDIN, bin_dir / "my-neuronx-cc")
    assert compiler_version("my-neuronx-cc") == DEFAULT_VERSION


def test_not_found_on_path(bin_dir: Path) -> None:
    with pytest.raises(KeyingError, match="--compiler-version") as excinfo:
        compiler_version()
    assert "on PATH" in str(excinfo.value)


def test_not_found_at_path(tmp_path: Path) -> None:
    with pytest.raises(KeyingError, match="--compiler-version") as excinfo:
        compiler_version(str(tmp_path / "nowhere" / "neuronx-cc"))
    assert "at that path" in str(excinfo.value)


def test_no_version_line_is_keying_error(bin_dir: Path) -> None:
    write_script(bin_dir / "neuronx-cc", "#!/bin/sh\necho 'usage: neuronx-cc compile ...'\n")
    with pytest.raises(KeyingError, match="printed no"):
        compiler_version()


def test_malformed_version_is_keying_error(bin_dir: Path) -> None:
    write_script(bin_dir / "neuronx-cc", "#!/bin/sh\necho 'NeuronX Compiler version 2.x+abc'\n")
    with pytest.raises(KeyingError, match="compiler version"):
        compiler_version()


def test_timeout_is_keying_error(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sleeper = f"#!/bin/sh\nexec {sys.executable} -c 'import time; time.sleep(30)'\n"
    write_script(bin_dir / "neuronx-cc", sleeper)
    monkeypatch.setattr(_compiler, "_TIMEOUT_SECONDS", 0.2)
    with pytest.raises(KeyingError, match="did not answer"):
        compiler_version()


def test_failure_is_not_memoized(bin_dir: Path, counter: Path) -> None:
    compiler = write_script(
        bin_dir / "neuronx-cc", '#!/bin/sh\necho x >> "$NEFFCACHE_STANDIN_COUNTER"\n'
    )
    with pytest.raises(KeyingError):
        compiler_version()
    with pytest.raises(KeyingError):
        compiler_version()
    assert invocations(counter) == 2
    assert compiler.exists()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_standin_prints_the_version_block(flag: str) -> None:
    done = subprocess.run(
        [sys.executable, str(STANDIN), flag], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == f"NeuronX Compiler version {DEFAULT_VERSION}"
    assert lines[1] == ""
    assert lines[2].startswith("Python version ")
    assert lines[3].startswith("HWM version ")
    assert done.stderr == ""


def test_standin_refuses_other_arguments() -> None:
    done = subprocess.run(
        [sys.executable, str(STANDIN), "frobnicate", "model.pb"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert "stand-in" in done.stderr


def test_check_compiler_version() -> None:
    assert check_compiler_version("2.20.9961.0+0acef03a") == "2.20.9961.0+0acef03a"
    with pytest.raises(KeyingError):
        check_compiler_version("neuronxcc-2.20.9961.0+0acef03a")
