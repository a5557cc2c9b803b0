"""``neffcache key``: in-process through ``main()`` and as a real process.

The compiler on PATH, where one is needed, is the stand-in at tests/standins/neuronx-cc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neffcache.client.cli import main
from neffcache.keying import (
    ENV_ALLOWLIST,
    CompileContext,
    KeyingError,
    KeyInputs,
    _compiler,
    compute_key,
    direct_key,
    fingerprint_hlo,
    neuron_flags_hash,
)

TESTS = Path(__file__).resolve().parent.parent
STANDINS = TESTS / "standins"
VERSION = "2.20.9961.0+0acef03a"
STANDIN_VERSION = "2.20.9961.0+0acef03a"
RESULT_KEYS = {"key", "direct_key", "fingerprint", "neuron_flags_hash", "components"}
_CLEARED_ENV = (*ENV_ALLOWLIST, "NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_CC_FLAGS")


def _jax_module() -> bytes:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    lowered = jax.jit(lambda x, y: jnp.tanh(x @ y)).lower(jnp.ones((2, 3)), jnp.ones((3, 4)))
    module: bytes = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    return module


def _committed_module() -> bytes | None:
    fixtures = sorted(
        (TESTS / "fixtures" / "hlo").glob("*.pb"), key=lambda p: p.name != "block_a.pb"
    )
    for path in fixtures:
        data = path.read_bytes()
        try:
            fingerprint_hlo(data)
        except KeyingError:
            continue
        return data
    return None


@pytest.fixture(scope="session")
def hlo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid serialized HloModuleProto: a committed fixture, else one lowered by JAX."""
    module = _committed_module() or _jax_module()
    path = tmp_path_factory.mktemp("hlo") / "model.hlo_module.pb"
    path.write_bytes(module)
    return path


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in ("NEFFCACHE_STANDIN_VERSION", "NEFFCACHE_STANDIN_VERSION_STREAM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_compiler, "_cache", {})


@pytest.fixture
def standin_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent)]))


@pytest.fixture
def no_compiler_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))


def run_key(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(["key", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else out), err


def run_ok(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, result, err = run_key(capsys, *argv)
    assert code == 0, err
    assert err == ""
    assert isinstance(result, dict)
    return result


def assert_one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run_key(capsys, *argv)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("neffcache key: error: ")
    return lines[0]


# --- output ---------------------------------------------------------------------------


def test_prints_the_keys_as_json(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    result = run_ok(capsys, str(hlo_file), "--compiler-version", VERSION, "--target", "trn1")
    assert set(result) == RESULT_KEYS

    module = hlo_file.read_bytes()
    context = CompileContext.create(compiler_version=VERSION, target="trn1")
    expected = compute_key(KeyInputs(fingerprint_hlo(module), context))
    assert result["fingerprint"] == fingerprint_hlo(module)
    assert result["key"] == expected.key
    assert result["direct_key"] == direct_key(module, context).key
    assert result["direct_key"] != result["key"]
    assert result["components"] == expected.as_json()
    assert result["components"]["key_version"] == "1"
    # docs/neuron-sdk.md#flags-hash: trn1 with no user flags is stored under +e30acd3a.
    assert result["neuron_flags_hash"] == "e30acd3a"


def test_flags_after_separator_are_normalized(
    capsys: pytest.CaptureFixture[str], hlo_file: Path
) -> None:
    result = run_ok(
        capsys,
        *(str(hlo_file), "--compiler-version", VERSION, "--target", "trn1"),
        *("--", "--model-type", "transformer", "-O1", "--cache_dir=/c", "--logfile=/w/log"),
    )
    assert result["components"]["flags"] == ["--model-type=transformer", "--optlevel=1"]
    # The stock hash keeps the caller's spelling, minus wrapper-only flags.
    assert result["neuron_flags_hash"] == neuron_flags_hash(
        ["--target=trn1", "--model-type", "transformer", "-O1", "--logfile=/w/log"]
    )


def test_flag_spelling_does_not_change_key(
    capsys: pytest.CaptureFixture[str], hlo_file: Path
) -> None:
    common = (str(hlo_file), "--compiler-version", VERSION, "--target", "trn1", "--")
    a = run_ok(capsys, *common, "--model-type=transformer", "--optlevel=1")
    b = run_ok(capsys, *common, "--model-type", "transformer", "-O", "1")
    c = run_ok(capsys, *common, "--model-type=transformer", "--optlevel=2")
    assert a["key"] == b["key"]
    assert a["direct_key"] == b["direct_key"]
    assert a["neuron_flags_hash"] != b["neuron_flags_hash"]  # the stock hash is token-exact
    assert c["key"] != a["key"]
    # Order is kept: differently named flags can compete in the compiler.
    d = run_ok(capsys, *common, "--optlevel=1", "--model-type=transformer")
    assert d["key"] != a["key"]


def test_nxd_flags_on_trn1_give_the_observed_stock_hash(
    capsys: pytest.CaptureFixture[str], hlo_file: Path
) -> None:
    result = run_ok(
        capsys,
        *(str(hlo_file), "--compiler-version", VERSION, "--target", "trn1"),
        *("--", "--model-type=transformer", "--cache_dir=/fsx/neuron-compile-cache"),
    )
    assert result["neuron_flags_hash"] == "3cc9a3cb"
    assert result["components"]["flags"] == ["--model-type=transformer"]


def test_allowlisted_environment_is_keyed(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = (str(hlo_file), "--compiler-version", VERSION, "--target", "trn2")
    before = run_ok(capsys, *argv)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d --xla_cpu_fast_math")
    monkeypatch.setenv("HOME", "/somewhere/else")
    after = run_ok(capsys, *argv)
    assert after["components"]["env"] == {"XLA_FLAGS": "--xla_cpu_fast_math"}
    assert before["components"]["env"] == {}
    assert after["key"] != before["key"]


# --- target ---------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [["--target=trn2"], ["--target", "trn2"]])
def test_target_from_flag(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, flags: list[str]
) -> None:
    result = run_ok(capsys, str(hlo_file), "--compiler-version", VERSION, "--", *flags)
    assert result["components"]["target"] == "trn2"
    assert result["components"]["flags"] == []
    assert result["neuron_flags_hash"] == neuron_flags_hash(flags)


def test_target_from_environment(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    result = run_ok(capsys, str(hlo_file), "--compiler-version", VERSION)
    assert result["components"]["target"] == "trn3"
    # docs/neuron-sdk.md#flags-hash: NEURON_PLATFORM_TARGET_OVERRIDE=trn3, no flags ->
    # +70e3f644.
    assert result["neuron_flags_hash"] == "70e3f644"


def test_explicit_target_wins_over_environment(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    result = run_ok(capsys, str(hlo_file), "--compiler-version", VERSION, "--target", "inf2")
    assert result["components"]["target"] == "inf2"


def test_no_target_is_exit_2(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    line = assert_one_line_error(capsys, str(hlo_file), "--compiler-version", VERSION)
    assert "target" in line


def test_contradicting_target_is_exit_2(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    line = assert_one_line_error(
        capsys,
        str(hlo_file),
        "--compiler-version",
        VERSION,
        "--target",
        "trn1",
        "--",
        "--target=trn2",
    )
    assert "contradicts" in line


def test_unknown_target_from_environment_is_exit_2(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    line = assert_one_line_error(capsys, str(hlo_file), "--compiler-version", VERSION)
    assert "trn9" in line


# --- bad input files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe\x00 this is not a protobuf", "not an HLO module"),
        (b"", "empty"),
        (b"HloModule m\n\nENTRY main {\n  ROOT p = f32[] parameter(0)\n}\n", "HLO text"),
    ],
    ids=["not-hlo", "empty", "hlo-text"],
)
def test_bad_file_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "model.hlo_module.pb"
    path.write_bytes(content)
    line = assert_one_line_error(
        capsys, str(path), "--compiler-version", VERSION, "--target", "trn1"
    )
    assert expected in line


def test_missing_file_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.pb"
    line = assert_one_line_error(
        capsys, str(missing), "--compiler-version", VERSION, "--target", "trn1"
    )
    assert str(missing) in line


def test_directory_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_one_line_error(capsys, str(tmp_path), "--compiler-version", VERSION, "--target", "trn1")


def test_bad_compiler_version_is_exit_2(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    line = assert_one_line_error(
        capsys, str(hlo_file), "--compiler-version", "latest", "--target", "trn1"
    )
    assert "latest" in line


# --- compiler version -----------------------------------------------------------------


@pytest.mark.usefixtures("standin_on_path")
def test_version_from_compiler_on_path(
    capsys: pytest.CaptureFixture[str], hlo_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_ok(capsys, str(hlo_file), "--target", "trn1")
    assert result["components"]["compiler_version"] == STANDIN_VERSION

    monkeypatch.setattr(_compiler, "_cache", {})
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.25.3371.0+f524f7f8")
    newer = run_ok(capsys, str(hlo_file), "--target", "trn1")
    assert newer["components"]["compiler_version"] == "2.25.3371.0+f524f7f8"
    assert newer["key"] != result["key"]


@pytest.mark.usefixtures("no_compiler_on_path")
def test_no_compiler_on_path_is_exit_2(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    line = assert_one_line_error(capsys, str(hlo_file), "--target", "trn1")
    assert "--compiler-version" in line


@pytest.mark.usefixtures("no_compiler_on_path")
def test_explicit_version_needs_no_compiler(
    capsys: pytest.CaptureFixture[str], hlo_file: Path
) -> None:
    result = run_ok(capsys, str(hlo_file), "--compiler-version", VERSION, "--target", "trn1")
    assert result["components"]["compiler_version"] == VERSION


# --- as a real process ----------------------------------------------------------------


def _process_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
    env.pop("NEFFCACHE_STANDIN_VERSION", None)
    env["PATH"] = os.pathsep.join([str(STANDINS), env.get("PATH", "")])
    return env


def _expected(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> dict[str, Any]:
    return run_ok(
        capsys,
        *(str(hlo_file), "--compiler-version", STANDIN_VERSION, "--target", "trn2"),
        *("--", "--model-type", "transformer"),
    )


def _check_process(done: subprocess.CompletedProcess[str], expected: dict[str, Any]) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result = json.loads(done.stdout)
    assert set(result) == RESULT_KEYS
    assert result == expected


PROCESS_ARGS = ("--target", "trn2", "--", "--model-type", "transformer")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=_process_env(),
        check=False,
        timeout=120,
    )


@pytest.mark.e2e
def test_python_dash_m_uses_compiler_on_path(
    capsys: pytest.CaptureFixture[str], hlo_file: Path
) -> None:
    done = _run([sys.executable, "-m", "neffcache.client.cli", "key", str(hlo_file), *PROCESS_ARGS])
    _check_process(done, _expected(capsys, hlo_file))


@pytest.mark.e2e
def test_real_process_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pb"
    path.write_bytes(b"")
    done = _run(
        [sys.executable, "-m", "neffcache.client.cli", "key", str(path), "--target", "trn1"]
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_console_script(capsys: pytest.CaptureFixture[str], hlo_file: Path) -> None:
    script = shutil.which("neffcache", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the neffcache console script is not installed next to this Python")
    done = _run([script, "key", str(hlo_file), *PROCESS_ARGS])
    _check_process(done, _expected(capsys, hlo_file))
