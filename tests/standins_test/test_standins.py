"""Pin the test stand-ins (tests/standins/) to docs/neuron-sdk.md.

The stand-ins replace the Neuron SDK, which cannot be installed here: ``neuronx-cc``
(#cache-location, #neuronx-cc-invocation-and-outputs, #neuronx-cc-version-output and
#the-sdk-in-late-2026-torchneuron-vllm-neuron), the ``libneuronxla`` package
(#cache-location, #entry-layout, #flags-hash, #neuronx-cc-invocation-and-outputs,
#locking, #neuron_parallel_compile and #libneuronxla-cache-api),
``neuron_parallel_compile.py`` (#parallel-compile), and the callers of the living stacks
(#the-sdk-in-late-2026-torchneuron-vllm-neuron): ``torchneuron_like.py``
(#torchneurons-compiler-call), ``vllm_neuron_like.py`` (#vllm-neuron) and
``trace_like.py`` (#torch-neuronx-tracing). Code under test is only as well tested as
these are faithful, so every test here checks a stand-in against a fact (or against a
documented stand-in choice).
"""

from __future__ import annotations

import ast
import errno
import fcntl
import hashlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

STANDINS = Path(__file__).resolve().parent.parent / "standins"
COMPILER = STANDINS / "neuronx-cc"
PARALLEL_COMPILE = STANDINS / "neuron_parallel_compile.py"
if str(STANDINS) not in sys.path:
    sys.path.insert(0, str(STANDINS))

import libneuronxla  # noqa: E402
from libneuronxla import libncc, neuron_cc_cache, neuron_cc_wrapper  # noqa: E402
from libneuronxla.neuron_cc_cache import (  # noqa: E402
    CacheUrl,
    CompileCache,
    CompileCacheFs,
    CompileCacheS3,
    create_compile_cache,
)

DEFAULT_VERSION = "2.20.9961.0+0acef03a"
VERSION_DIR = f"neuronxcc-{DEFAULT_VERSION}"
VERSION_RE = re.compile(r"NeuronX Compiler version (\S+)")
MAGIC = b"STANDIN-NEFF\n"

_CLEARED_ENV = (
    "NEFFCACHE_STANDIN_VERSION",
    "NEFFCACHE_STANDIN_VERSION_STREAM",
    "NEFFCACHE_STANDIN_COUNTER",
    "NEFFCACHE_STANDIN_DELAY",
    "NEFFCACHE_STANDIN_NEFF_BYTES",
    "NEFFCACHE_STANDIN_FAIL",
    "NEFFCACHE_STANDIN_PIDFILE_DIR",
    "NEFFCACHE_STANDIN_LOCK_TIMEOUT",
    "NEFFCACHE_STANDIN_HLO_FIRST",
    "NEFFCACHE_STANDIN_HASH_TARGET",
    "NEFFCACHE_STANDIN_PATH_LOG",
    "NEURON_CC_FLAGS",
    "NEURON_COMPILE_CACHE_URL",
    "NEURON_EXTRACT_GRAPHS_ONLY",
    "NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG",
    "NEURON_PARALLEL_COMPILE_MAX_RETRIES",
    "NEURON_PLATFORM_TARGET_OVERRIDE",
)


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    # The stand-in compiler first on PATH; its "#!/usr/bin/env python3" finds this python.
    path = os.pathsep.join(
        [str(STANDINS), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("USER", "tester")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    neuron_cc_cache._COMPILER_VERSIONS.clear()
    yield
    neuron_cc_cache._COMPILER_VERSIONS.clear()


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "invocations"
    monkeypatch.setenv("NEFFCACHE_STANDIN_COUNTER", str(path))
    return path


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def compile_runs(counter: Path) -> int:
    """How many times the stand-in compiler ran ``compile`` (not ``--version``)."""
    if not counter.exists():
        return 0
    return sum(1 for line in counter.read_text().splitlines() if " compile " in f"{line} ")


def run_compiler(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(COMPILER), *args],
        capture_output=True,
        text=True,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def u64_fingerprint(module: bytes) -> str:
    """The stand-in's documented module key for cache_key=None, recomputed here."""
    return str(int.from_bytes(hashlib.sha256(module).digest()[:8], "big"))


def md5_8(flags: list[str]) -> str:
    return hashlib.md5(json.dumps(flags).encode(), usedforsecurity=False).hexdigest()[:8]


def entry_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("neuronxcc-*/MODULE_*"))


def write_input(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- neuronx-cc


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_version_block_still_parses(stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION_STREAM", stream)
    done = run_compiler("--version")
    assert done.returncode == 0
    text = getattr(done, stream)
    match = VERSION_RE.search(text)
    assert match is not None
    assert match.group(1) == DEFAULT_VERSION
    # docs/neuron-sdk.md#neuronx-cc-version-output: a blank line after the version.
    assert text.splitlines()[1] == ""
    assert getattr(done, "stderr" if stream == "stdout" else "stdout") == ""


def test_cache_reads_version_from_compiler_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION", "2.25.3371.0+f524f7f8")
    monkeypatch.setenv("NEFFCACHE_STANDIN_VERSION_STREAM", "stderr")
    assert neuron_cc_cache.get_compiler_version() == "2.25.3371.0+f524f7f8"


def test_compile_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write_input(tmp_path / "a.pb", b"module A")
    a_copy = write_input(tmp_path / "elsewhere.pb", b"module A")
    b = write_input(tmp_path / "b.pb", b"module B")

    def neff(input_file: Path, *flags: str, target: str = "trn1") -> bytes:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.neff"
        argv = [
            "compile",
            f"--target={target}",
            "--framework=XLA",
            str(input_file),
            "--output",
            str(out),
            *flags,
            "--verbose=35",
        ]
        done = run_compiler(*argv)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "Compiler status PASS"
        return out.read_bytes()

    base = neff(a, "--model-type=transformer")
    assert base.startswith(MAGIC)
    assert len(base) == 4096
    assert neff(a, "--model-type=transformer") == base
    # A function of the input's bytes, not of its path.
    assert neff(a_copy, "--model-type=transformer") == base
    # --x v and --x=v are the same flag; --logfile is a path, not a flag of the NEFF.
    assert neff(a, "--model-type", "transformer", "--logfile=/tmp/somewhere.log") == base
    assert neff(a, "--model-type=transformer", "--optlevel=1") != base
    assert neff(a) != base
    assert neff(b, "--model-type=transformer") != base
    assert neff(a, "--model-type=transformer", target="trn2") != base
    monkeypatch.setenv("NEFFCACHE_STANDIN_NEFF_BYTES", "100")
    short = neff(a, "--model-type=transformer")
    assert short == base[:100]


def test_both_argv_forms(tmp_path: Path) -> None:
    """docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs: the >= 2.15 form and the
    2024-01 form give the same NEFF."""
    hlo = write_input(tmp_path / "model.hlo.pb", b"some hlo bytes")
    new, old, tnx = tmp_path / "new.neff", tmp_path / "old.neff", tmp_path / "tnx.neff"
    flags = ["--model-type=transformer", "--auto-cast=none"]
    forms = [
        ["compile", "--target=trn1", "--framework=XLA", str(hlo), "--output", str(new)],
        ["--target=trn1", "compile", "--framework", "XLA", str(hlo), "--output", str(old)],
        # transformers-neuronx's direct form (docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs),
        # with --pipeline's two values.
        ["compile", "--framework=XLA", "--target", "trn1", str(hlo), f"--output={tnx}"],
    ]
    tails = [["--verbose=35"], ["--verbose=35"], ["--verbose=INFO"]]
    for form, tail in zip(forms, tails, strict=True):
        done = run_compiler(*form, *flags, *tail)
        assert done.returncode == 0, done.stderr
    assert new.read_bytes() == old.read_bytes() == tnx.read_bytes()
    done = run_compiler(*forms[0], *flags, "--pipeline", "compile", "SaveTemps")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["compile", "--framework=XLA", "--output", "OUT"],  # no input
        ["compile", "--framework=XLA", "IN"],  # no output
        ["compile", "IN", "IN", "--output", "OUT"],  # two inputs
        ["compile", "IN", "--output"],  # --output without a value
        ["compile", "MISSING", "--output", "OUT"],  # input does not exist
        ["compile", "EMPTY", "--output", "OUT"],  # input is empty
    ],
)
def test_usage_errors_exit_2(argv: list[str], tmp_path: Path) -> None:
    write_input(tmp_path / "IN", b"x")
    write_input(tmp_path / "EMPTY", b"")
    out = tmp_path / "OUT"
    resolved = [str(tmp_path / a) if a in ("IN", "MISSING", "EMPTY", "OUT") else a for a in argv]
    done = run_compiler(*resolved)
    assert done.returncode == 2
    assert "error" in done.stderr
    assert not out.exists()


def test_other_arguments_exit_3() -> None:
    done = run_compiler("frobnicate", "x")
    assert done.returncode == 3
    assert "stand-in" in done.stderr


@pytest.mark.parametrize("how", ["env", "marker"])
def test_failure_on_demand(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"hlo"
    if how == "env":
        monkeypatch.setenv("NEFFCACHE_STANDIN_FAIL", "yes")
    else:
        data = b"prefix NEFFCACHE_STANDIN_FAIL suffix"
    work = tmp_path / "work"
    work.mkdir()
    hlo = write_input(work / "in.pb", data)
    out = work / "out.neff"
    done = run_compiler("compile", "--framework=XLA", str(hlo), "--output", str(out))
    assert done.returncode == 70
    assert "Compiler status ERROR" in done.stdout
    assert "ERROR" in done.stderr
    assert not out.exists()
    assert sorted(p.name for p in work.iterdir()) == ["in.pb"]  # no partial file left


def test_counter_one_line_per_invocation_under_concurrency(tmp_path: Path, counter: Path) -> None:
    hlo = write_input(tmp_path / "in.pb", b"hlo")
    long_flag = "--x=" + "y" * 3000  # long lines interleave if written in pieces
    compile_argv = [sys.executable, str(COMPILER), "compile", str(hlo), "--output"]
    procs = [
        subprocess.Popen(
            [*compile_argv, f"{tmp_path}/{i}.neff", long_flag],
            stdout=subprocess.DEVNULL,
        )
        for i in range(8)
    ]
    assert [p.wait() for p in procs] == [0] * 8
    lines = counter.read_text().splitlines()
    expected = {
        f"neuronx-cc compile {hlo} --output {tmp_path}/{i}.neff {long_flag}" for i in range(8)
    }
    assert len(lines) == 8
    assert set(lines) == expected
    run_compiler("--version")
    assert counter.read_text().splitlines()[-1] == "neuronx-cc --version"


def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_compile_leaves_no_output(
    sig: signal.Signals, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("NEFFCACHE_STANDIN_DELAY", "30")
    monkeypatch.setenv("NEFFCACHE_STANDIN_PIDFILE_DIR", str(pids))
    hlo = write_input(tmp_path / "in.pb", b"hlo")
    out = tmp_path / "out.neff"
    proc = subprocess.Popen(
        [sys.executable, str(COMPILER), "compile", str(hlo), "--output", str(out)],
        stdout=subprocess.DEVNULL,
    )
    _wait_for(lambda: any(tmp_path.glob(".out.neff.*")), "the partial NEFF")
    assert [p.name for p in pids.iterdir()] == [str(proc.pid)]
    os.kill(int(next(pids.iterdir()).name), sig)
    proc.wait(timeout=10)
    assert not out.exists()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
        assert list(pids.iterdir()) == []  # the pidfile is removed at exit
        assert not any(tmp_path.glob(".out.neff.*"))
    else:
        # Half a NEFF was written before the kill, but only to the temporary file.
        assert any(tmp_path.glob(".out.neff.*"))


def test_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEFFCACHE_STANDIN_DELAY", "0.3")
    hlo = write_input(tmp_path / "in.pb", b"hlo")
    start = time.monotonic()
    done = run_compiler("compile", str(hlo), "--output", str(tmp_path / "o.neff"))
    assert done.returncode == 0
    assert time.monotonic() - start >= 0.3


# --------------------------------------------------------------------------- libncc


def test_setup_args_strips_wrapper_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "NEURON_CC_FLAGS",
        "--model-type=transformer --cache_dir='/a dir' --no_cache --retry_failed_compilation "
        "--log_level INFO --dump=/d --compile_workdir /w --optlevel 1",
    )
    args, compiler_flags, parsed = libncc.setup_args()  # a 3-tuple (docs/neuron-sdk.md#setup_args)
    assert args.cache_dir == "/a dir"
    assert args.no_cache is True
    assert args.retry_failed_compilation is True
    assert args.log_level == "INFO"
    assert args.dump == "/d"
    assert args.compile_workdir == "/w"
    assert args.compiler_flags == ["--model-type=transformer", "--optlevel", "1"]
    assert compiler_flags == args.compiler_flags
    assert parsed == os.environ["NEURON_CC_FLAGS"]
    empty, _, _ = libncc.setup_args("")
    assert (empty.cache_dir, empty.no_cache, empty.compiler_flags) == (None, False, [])


# --------------------------------------------------------------------------- keys


# docs/neuron-sdk.md#flags-hash: every json-era suffix with its preimage.
JSON_ERA_GOLDENS = [
    ("39f12043", ["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"]),
    ("3cc9a3cb", ["--target=trn1", "--model-type=transformer"]),
    ("e30acd3a", ["--target=trn1"]),
    ("70e3f644", ["--target=trn3"]),
    (
        "839ddec0",
        [
            "--target=trn2",
            "--model-type=transformer",
            "--optlevel=1",
            "--enable-saturate-infinity",
            "--lnc=2",
        ],
    ),
]


@pytest.mark.parametrize(("suffix", "flags"), JSON_ERA_GOLDENS)
def test_flags_hash_goldens(suffix: str, flags: list[str]) -> None:
    assert CompileCache.get_compiler_flags_hash(flags) == suffix
    assert CompileCacheFs.get_compiler_flags_hash(" ".join(flags)) == suffix  # str: split first


def test_flags_hash_follows_the_json_era_not_the_raw_string_era() -> None:
    # docs/neuron-sdk.md#flags-hash: md5("--model-type=transformer") = abb26765 belongs to
    # neuronxcc <= 2.13.
    assert CompileCache.get_compiler_flags_hash("--model-type=transformer") != "abb26765"
    assert CompileCache.get_compiler_flags_hash([]) == md5_8([]) != "d41d8cd9"
    # docs/neuron-sdk.md#flags-hash item 8: token-exact.
    assert CompileCache.get_compiler_flags_hash(
        ["--model-type=transformer"]
    ) != CompileCache.get_compiler_flags_hash(["--model-type", "transformer"])


@pytest.mark.parametrize(
    ("target", "env", "caller_flags", "suffix"),
    [
        # Rows of docs/neuron-sdk.md#flags-hash, reproduced through neuron_xla_compile.
        ("trn1", {}, [], "e30acd3a"),
        (
            "trn1",
            {"NEURON_CC_FLAGS": "--model-type=transformer --cache_dir={cache}"},
            [],
            "3cc9a3cb",
        ),
        ("trn1", {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"}, [], "70e3f644"),
        (
            "trn2",
            {
                "NEURON_CC_FLAGS": "--model-type=transformer --optlevel=1 "
                "--enable-saturate-infinity --lnc=2"
            },
            [],
            "839ddec0",
        ),
        (
            "trn1",
            {"NEFFCACHE_STANDIN_HASH_TARGET": "0"},
            ["--model-type=transformer", "--auto-cast=none", "--execute-repetition=1"],
            "39f12043",
        ),
    ],
)
def test_entry_key_through_neuron_xla_compile(
    target: str,
    env: dict[str, str],
    caller_flags: list[str],
    suffix: str,
    cache_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(cache_root))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(cache=cache_root))
    module = b"an hlo module"
    libneuronxla.neuron_xla_compile(module, caller_flags, platform_target=target)
    (entry,) = entry_dirs(cache_root)
    assert entry.parent.name == VERSION_DIR
    assert entry.name == f"MODULE_{u64_fingerprint(module)}+{suffix}"
    # compile_flags.json holds the hashed list (the stand-in's documented guess).
    flags = json.loads((entry / "compile_flags.json").read_text())
    assert md5_8(flags) == suffix
    assert "--cache_dir" not in " ".join(flags)


def test_caller_cache_key_is_used(cache_root: Path) -> None:
    libneuronxla.neuron_xla_compile(
        b"m",
        ["--model-type=transformer"],
        cache_key="0123456789abcdef0123",
        cache_dir=str(cache_root),
    )
    (entry,) = entry_dirs(cache_root)
    suffix = md5_8(["--target=trn1", "--model-type=transformer"])
    assert entry.name == f"MODULE_0123456789abcdef0123+{suffix}"


def test_str_flags_warn_and_key_like_a_list(cache_root: Path) -> None:
    with pytest.warns(SyntaxWarning, match="str format compiler_flags is discouraged"):
        as_str = libneuronxla.neuron_xla_compile(
            b"m", "--model-type=transformer --optlevel 1", cache_dir=str(cache_root)
        )
    as_list = libneuronxla.neuron_xla_compile(
        b"m", ["--model-type=transformer", "--optlevel", "1"], cache_dir=str(cache_root)
    )
    assert as_str == as_list
    assert len(entry_dirs(cache_root)) == 1


# --------------------------------------------------------------------------- CacheUrl


def test_cache_url_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/neuron-sdk.md#cache-location: argument > --cache_dir in NEURON_CC_FLAGS >
    NEURON_COMPILE_CACHE_URL > /var/tmp/neuron-compile-cache."""
    assert CacheUrl.get_cache_url() == CacheUrl("/var/tmp/neuron-compile-cache", "fs")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "/from/env")
    assert CacheUrl.get_cache_url().url == "/from/env"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer --cache_dir=/from/flags")
    assert CacheUrl.get_cache_url().url == "/from/flags"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir /from/flags2 --optlevel=1")
    assert CacheUrl.get_cache_url().url == "/from/flags2"
    assert CacheUrl.get_cache_url("/from/arg").url == "/from/arg"
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert CacheUrl.get_cache_url("/from/arg").url == "/from/arg"


def test_cache_url_types(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "s3://bucket/prefix")
    s3 = CacheUrl.get_cache_url()
    assert s3.is_s3()
    assert (s3.url, s3.url_type) == ("s3://bucket/prefix", "s3")
    s3_cache = create_compile_cache(s3)
    assert isinstance(s3_cache, CompileCacheS3)
    with pytest.raises(NotImplementedError):
        s3_cache.exists("s3://bucket/prefix/x")
    local = CacheUrl.get_cache_url(f"file://{tmp_path}")
    assert (local.url, local.url_type, local.is_s3()) == (str(tmp_path), "fs", False)
    assert isinstance(create_compile_cache(local), CompileCacheFs)
    assert isinstance(libneuronxla.create_compile_cache(CacheUrl(str(tmp_path))), CompileCacheFs)


# --------------------------------------------------------------------------- entries


class Spy:
    """Records calls to CompileCacheFs methods (name, first argument) in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.calls: list[tuple[str, str]] = []
        for name in names:
            original = getattr(CompileCacheFs, name)
            monkeypatch.setattr(CompileCacheFs, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def spy(cache: CompileCacheFs, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, os.path.basename(str(args[0]))))
            return original(cache, *args, **kwargs)

        return spy


def test_successful_entry_layout(
    cache_root: Path, counter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch, "upload_file", "upload_string_to_file", "exists")
    module = b"\x0a\x05block a serialized module"
    neff = libneuronxla.neuron_xla_compile(
        module, ["--model-type=transformer"], cache_dir=str(cache_root)
    )
    (entry,) = entry_dirs(cache_root)
    assert sorted(p.name for p in entry.iterdir()) == [
        "compile_flags.json",
        "model.done",
        "model.hlo_module.pb",
        "model.neff",
    ]
    assert (entry / "model.hlo_module.pb").read_bytes() == module
    assert json.loads((entry / "compile_flags.json").read_text()) == [
        "--target=trn1",
        "--model-type=transformer",
    ]
    assert (entry / "model.neff").read_bytes() == neff
    assert (entry / "model.done").stat().st_size == 0
    # The cache-wide lock file (docs/neuron-sdk.md#entry-layout).
    assert (cache_root / "lock").is_file()
    # A miss probes model.done, then model.log (docs/neuron-sdk.md#hit-detection);
    # model.neff is copied back before model.done (#neuronx-cc-invocation-and-outputs).
    assert spy.calls[:2] == [("exists", "model.done"), ("exists", "model.log")]
    uploads = [name for kind, name in spy.calls if kind.startswith("upload")]
    assert uploads == ["model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done"]
    assert compile_runs(counter) == 1
    # The argv of docs/neuron-sdk.md#neuronx-cc-invocation-and-outputs; the NEFF is what
    # the compiler makes of the module and the flags.
    (line,) = [x for x in counter.read_text().splitlines() if " compile " in x]
    stem = f"model.{entry.name}"
    assert re.fullmatch(
        r"neuronx-cc compile --target=trn1 --framework=XLA "
        rf"(\S+)/tester/neuroncc_compile_workdir/[0-9a-f-]{{36}}/{re.escape(stem)}\.hlo_module\.pb "
        rf"--output \S+/{re.escape(stem)}\.neff --model-type=transformer --verbose=35",
        line,
    ), line
    direct = tmp_path / "direct.neff"
    hlo = write_input(tmp_path / "direct.pb", module)
    done = run_compiler(
        "compile", "--target=trn1", str(hlo), "--output", str(direct), "--model-type=transformer"
    )
    assert done.returncode == 0
    assert direct.read_bytes() == neff
    # The private work dir is gone afterwards.
    assert list((tmp_path / "tmp" / "tester" / "neuroncc_compile_workdir").iterdir()) == []


def test_second_call_is_a_hit(
    cache_root: Path,
    counter: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert compile_runs(counter) == 1
    spy = Spy(monkeypatch, "exists", "upload_file", "upload_string_to_file")
    caplog.set_level(logging.INFO, logger="libneuronxla")
    second = libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert second == first
    assert compile_runs(counter) == 1
    assert spy.calls == [("exists", "model.done")]  # a hit writes nothing
    (entry,) = entry_dirs(cache_root)
    assert (
        f"||NEURON_CC_WRAPPER||: Using a cached neff at {entry}/model.neff. "
        "Exiting with a successfully compiled graph."
    ) in caplog.messages
    assert f"||NEURON_CACHE||: Compile cache path: {cache_root}" in caplog.messages


def test_hlo_first_switch(cache_root: Path, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    monkeypatch.setenv("NEFFCACHE_STANDIN_HLO_FIRST", "1")
    spy = Spy(monkeypatch, "exists", "upload_file", "upload_string_to_file")
    libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert spy.calls == [
        ("upload_file", "model.hlo_module.pb"),
        ("upload_string_to_file", "compile_flags.json"),
        ("exists", "model.done"),
    ]
    assert compile_runs(counter) == 1


def test_failure_is_replayed_until_retry(
    cache_root: Path, counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEFFCACHE_STANDIN_FAIL", "1")
    with pytest.raises(RuntimeError, match=r"Compilation failed for \S+ after 0 retries\."):
        libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    (entry,) = entry_dirs(cache_root)
    # docs/neuron-sdk.md#entry-states, "Failed": model.log, no model.neff, no model.done,
    # no lock.
    assert sorted(p.name for p in entry.iterdir()) == [
        "compile_flags.json",
        "model.hlo_module.pb",
        "model.log",
    ]
    assert "NCC_STANDIN001" in (entry / "model.log").read_text()
    assert compile_runs(counter) == 1

    monkeypatch.delenv("NEFFCACHE_STANDIN_FAIL")
    expected = re.escape(
        f"Got a cached failed neff at {entry}/model.neff. Will skip compilation, please set "
        "--retry_failed_compilation"
    )
    with pytest.raises(RuntimeError, match=expected):
        libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert compile_runs(counter) == 1  # replayed, not recompiled

    # --retry_failed_compilation in NEURON_CC_FLAGS: stripped before hashing, same entry.
    monkeypatch.setenv("NEURON_CC_FLAGS", "--retry_failed_compilation")
    neff = libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert compile_runs(counter) == 2
    assert entry_dirs(cache_root) == [entry]
    assert (entry / "model.neff").read_bytes() == neff
    assert (entry / "model.done").exists()


def test_retry_failed_compilation_argument(cache_root: Path, counter: Path) -> None:
    with pytest.raises(RuntimeError, match="Compilation failed"):
        libneuronxla.neuron_xla_compile(b"NEFFCACHE_STANDIN_FAIL", [], cache_dir=str(cache_root))
    with pytest.raises(RuntimeError, match="Compilation failed"):
        libneuronxla.neuron_xla_compile(
            b"NEFFCACHE_STANDIN_FAIL", [], cache_dir=str(cache_root), retry_failed_compilation=True
        )
    assert compile_runs(counter) == 2


def test_max_retries(cache_root: Path, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_PARALLEL_COMPILE_MAX_RETRIES", "2")
    with pytest.raises(RuntimeError, match="after 2 retries"):
        libneuronxla.neuron_xla_compile(b"NEFFCACHE_STANDIN_FAIL", [], cache_dir=str(cache_root))
    assert compile_runs(counter) == 3


def test_no_cache(tmp_path: Path, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", f"--no_cache --cache_dir={tmp_path / 'c'}")
    first = libneuronxla.neuron_xla_compile(b"module", [])
    second = libneuronxla.neuron_xla_compile(b"module", [])
    assert first == second
    assert compile_runs(counter) == 2
    assert not (tmp_path / "c").exists()


def test_same_graph_compiled_once_by_concurrent_callers(
    cache_root: Path, counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/neuron-sdk.md#per-entry-compile-lock: callers serialize on the entry lock; one
    compiles, the others hit."""
    monkeypatch.setenv("NEFFCACHE_STANDIN_DELAY", "0.3")
    results: list[bytes] = []

    def compile_it() -> None:
        results.append(libneuronxla.neuron_xla_compile(b"shared", [], cache_dir=str(cache_root)))

    threads = [threading.Thread(target=compile_it) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(results) == 3
    assert len(set(results)) == 1
    assert compile_runs(counter) == 1


# --------------------------------------------------------------------------- the cache API


def make_entry(root: Path, name: str, files: dict[str, bytes]) -> Path:
    entry = root / VERSION_DIR / name
    entry.mkdir(parents=True)
    for filename, data in files.items():
        (entry / filename).write_bytes(data)
    return entry


def test_get_hlos_classifies_the_four_states(cache_root: Path) -> None:
    """The table of docs/neuron-sdk.md#entry-states, plus the pre-2.12 HLO name
    model.hlo.pb (#entry-layout)."""
    hlo = "model.hlo_module.pb"
    success = make_entry(
        cache_root, "MODULE_1+e30acd3a", {hlo: b"h", "model.neff": b"n", "model.done": b""}
    )
    failed = make_entry(cache_root, "MODULE_2+e30acd3a", {hlo: b"h", "model.log": b"boom"})
    locked = make_entry(cache_root, "MODULE_3+e30acd3a", {hlo: b"h", hlo + ".lock": b""})
    empty = make_entry(cache_root, "MODULE_4+e30acd3a", {hlo: b"h", "compile_flags.json": b"[]"})
    legacy = make_entry(cache_root, "MODULE_5+abb26765", {"model.hlo.pb": b"h"})
    placeholder = make_entry(cache_root, "MODULE_6+e30acd3a", {hlo: b"h", "model.neff": b"FAILED"})
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    todo, locked_hlos, done, failed_hlos = cache.get_hlos()
    assert done == [str(success / hlo)]
    assert failed_hlos == [str(failed / hlo)]
    assert locked_hlos == [str(locked / hlo)]
    assert todo == [str(empty / hlo), str(legacy / "model.hlo.pb"), str(placeholder / hlo)]
    # failed_neff_str: a placeholder model.neff holding it counts as failed (stand-in guess).
    assert cache.get_hlos(failed_neff_str="FAILED")[3] == [
        str(failed / hlo),
        str(placeholder / hlo),
    ]

    assert cache.try_lookup_for_compile(str(success / hlo)) is None
    assert cache.try_lookup_for_compile(str(locked / hlo)) is None
    entry = cache.try_lookup_for_compile(str(empty / hlo))
    assert entry is not None
    assert (entry.key, entry.hlo_path, entry.exists, entry.cache) == (
        "MODULE_4+e30acd3a",
        str(empty / hlo),
        False,
        cache,
    )
    with entry:
        assert (empty / (hlo + ".lock")).exists()
        assert cache.try_lookup_for_compile(str(empty / hlo)) is None
    assert not (empty / (hlo + ".lock")).exists()


def test_stale_lock_blocks_until_clear_locks(
    cache_root: Path,
    counter: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/neuron-sdk.md#per-entry-compile-lock: an existence-based lock left by a killed
    compile never expires."""
    module = b"module"
    key = f"MODULE_{u64_fingerprint(module)}+{md5_8(['--target=trn1'])}"
    entry = make_entry(cache_root, key, {"model.hlo_module.pb": module})
    (entry / "model.hlo_module.pb.lock").write_bytes(b"")
    os.utime(entry / "model.hlo_module.pb.lock", (0, 0))  # however old it is
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    caplog.set_level(logging.INFO, logger="libneuronxla")
    with pytest.raises(TimeoutError):
        cache.hlo_acquire_lock(str(entry / "model.hlo_module.pb"), timeout=0.2)
    assert (
        f"Another process must be compiling {key}, been waiting for: 0 minutes" in caplog.messages
    )

    monkeypatch.setenv("NEFFCACHE_STANDIN_LOCK_TIMEOUT", "0.2")
    with pytest.raises(TimeoutError):
        libneuronxla.neuron_xla_compile(module, [], cache_dir=str(cache_root))
    assert compile_runs(counter) == 0
    assert (entry / "model.hlo_module.pb.lock").exists()

    cache.clear_locks()
    assert not list(cache_root.rglob("*.lock"))
    assert (cache_root / "lock").exists()  # the cache-wide lock is not a *.lock file
    libneuronxla.neuron_xla_compile(module, [], cache_dir=str(cache_root))
    assert (entry / "model.done").exists()
    assert not (entry / "model.hlo_module.pb.lock").exists()


def test_killed_wrapper_leaves_a_stale_lock(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(STANDINS),
        "NEFFCACHE_STANDIN_DELAY": "30",
        "NEFFCACHE_STANDIN_PIDFILE_DIR": str(pids),
    }
    code = (
        "import sys, libneuronxla; libneuronxla.neuron_xla_compile(b'm', [], cache_dir=sys.argv[1])"
    )
    wrapper = subprocess.Popen([sys.executable, "-c", code, str(cache_root)], env=env)
    try:
        _wait_for(lambda: any(pids.iterdir()), "the compiler's pidfile")
    finally:
        wrapper.kill()
        wrapper.wait()
    for pidfile in pids.iterdir():
        os.kill(int(pidfile.name), signal.SIGKILL)
    (entry,) = entry_dirs(cache_root)
    assert sorted(p.name for p in entry.iterdir()) == [
        "compile_flags.json",
        "model.hlo_module.pb",
        "model.hlo_module.pb.lock",
    ]
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    assert cache.get_hlos()[1] == [str(entry / "model.hlo_module.pb")]
    monkeypatch.setenv("NEFFCACHE_STANDIN_LOCK_TIMEOUT", "0.2")
    with pytest.raises(TimeoutError):
        libneuronxla.neuron_xla_compile(b"m", [], cache_dir=str(cache_root))
    cache.clear_locks()
    assert libneuronxla.neuron_xla_compile(b"m", [], cache_dir=str(cache_root)).startswith(MAGIC)


def test_file_operations(cache_root: Path, tmp_path: Path) -> None:
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    src = write_input(tmp_path / "src.bin", b"0123456789")
    target = str(cache_root / "a" / "b.bin")
    assert not cache.exists(target)
    cache.upload_file(target, str(src))
    assert cache.exists(target)
    assert cache.download_file_to_string(target) == "0123456789"
    assert cache.download_file_to_string(target, limit=4) == "0123"
    cache.upload_string_to_file(str(cache_root / "a" / "s.txt"), "text")
    cache.download_file(str(cache_root / "a" / "s.txt"), str(tmp_path / "dl" / "s.txt"))
    assert (tmp_path / "dl" / "s.txt").read_text() == "text"
    assert cache.download_folder(str(cache_root / "a"), str(tmp_path / "folder"))
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["b.bin", "s.txt"]
    assert not cache.download_folder(str(cache_root / "missing"), str(tmp_path / "x"))
    cache.upload_folder(str(cache_root / "copy"), str(tmp_path / "folder"))
    assert (cache_root / "copy" / "b.bin").read_bytes() == b"0123456789"
    cache.remove(str(cache_root / "copy"))
    assert not (cache_root / "copy").exists()
    # No temporary files are left behind by the atomic uploads.
    assert sorted(p.name for p in (cache_root / "a").iterdir()) == ["b.bin", "s.txt"]
    parent, key = cache.get_cache_dir("42", ["--target=trn1"])
    assert (parent, key) == (
        str(cache_root / VERSION_DIR / "MODULE_42+e30acd3a"),
        "MODULE_42+e30acd3a",
    )
    assert cache.get_cache_dir_with_cache_key("MODULE_7") == str(
        cache_root / VERSION_DIR / "MODULE_7"
    )

    hlo = "model.hlo_module.pb"
    entry = make_entry(cache_root, "MODULE_1+x", {hlo: b"h", "model.neff": b"n", "model.done": b""})
    cache.clear_neffs()
    assert sorted(p.name for p in entry.iterdir()) == [hlo]
    cache.clean()
    assert [p.name for p in cache_root.iterdir()] == ["lock"]


# --------------------------------------------------------------------------- locking


def test_wrapper_uses_its_own_create_compile_cache_binding(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/neuron-sdk.md#libneuronxla-cache-api: patching create_compile_cache means
    patching every binding."""
    seen: list[CacheUrl] = []
    real = neuron_cc_cache.create_compile_cache

    def spy(url: CacheUrl) -> CompileCache:
        seen.append(url)
        return real(url)

    monkeypatch.setattr(neuron_cc_wrapper, "create_compile_cache", spy)
    libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))
    assert seen == [CacheUrl(str(cache_root), "fs")]

    def refuse(url: CacheUrl) -> CompileCache:
        raise AssertionError("the wrapper must not reach this binding")

    monkeypatch.setattr(neuron_cc_wrapper, "create_compile_cache", real)
    monkeypatch.setattr(neuron_cc_cache, "create_compile_cache", refuse)
    monkeypatch.setattr(libneuronxla, "create_compile_cache", refuse)
    libneuronxla.neuron_xla_compile(b"module", [], cache_dir=str(cache_root))


def test_every_method_takes_the_root_lock(cache_root: Path) -> None:
    """docs/neuron-sdk.md#cache-wide-lock: even exists() waits for <root>/lock; the lock is
    re-entrant."""
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    assert isinstance(cache, CompileCacheFs)
    with cache.lock_dir, cache.lock_dir:
        assert not cache.exists(str(cache_root / "x"))  # same thread: no deadlock
    assert (cache_root / "lock").exists()
    answers: list[bool] = []
    with open(cache_root / "lock", "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        thread = threading.Thread(target=lambda: answers.append(cache.exists(str(cache_root))))
        thread.start()
        thread.join(timeout=0.3)
        assert thread.is_alive()
        assert answers == []
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    thread.join(timeout=30)  # only ends the wait: the lock is free now
    assert answers == [True]


def test_read_only_filesystem_fails_on_the_root_lock(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """djl-serving PR #1879: ``OSError: [Errno 30] Read-only file system: '<root>/lock'``.

    Simulated for root, which a chmod cannot stop: opening the lock fails with EROFS."""
    entry = make_entry(cache_root, "MODULE_1+e30acd3a", {"model.neff": b"n", "model.done": b""})
    lock_path = str(cache_root / "lock")

    def read_only_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(neuron_cc_cache, "open", read_only_open, raising=False)
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    with pytest.raises(OSError, match="Read-only file system") as raised:
        cache.exists(str(entry / "model.done"))
    assert raised.value.errno == errno.EROFS
    assert raised.value.filename == lock_path


_READ_ONLY_PROBE = """
import os, sys
sys.path.insert(0, sys.argv[1])
from libneuronxla.neuron_cc_cache import CacheUrl, create_compile_cache
root, done = sys.argv[2], sys.argv[3]
print("readable" if os.path.exists(done) else "unreadable")
try:
    create_compile_cache(CacheUrl(root)).exists(done)
except PermissionError as exc:
    print("PermissionError", exc.filename)
else:
    print("no error")
"""


def _python_for_nobody() -> str | None:
    for candidate in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if candidate is None:
            continue
        try:
            done = subprocess.run(
                [candidate, "-c", "import fcntl"],
                user=65534,
                group=65534,
                extra_groups=[],
                capture_output=True,
                timeout=10,
                check=False,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    return None


def test_read_only_cache_dir_fails_on_the_root_lock() -> None:
    """docs/neuron-sdk.md#cache-wide-lock: a read-only cache directory fails outright,
    even for exists(), because every method opens <root>/lock for writing."""
    base = Path(tempfile.mkdtemp(prefix="neffcache-ro-", dir="/tmp"))
    try:
        base.chmod(0o755)
        root = base / "cache"
        entry = make_entry(root, "MODULE_1+e30acd3a", {"model.neff": b"n", "model.done": b""})
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        done = entry / "model.done"
        if os.geteuid() != 0:
            cache = create_compile_cache(CacheUrl(str(root)))
            with pytest.raises(PermissionError) as raised:
                cache.exists(str(done))
            assert raised.value.filename == str(root / "lock")
            return
        python = _python_for_nobody()
        if python is None:
            pytest.skip("running as root and no python runs as nobody")
        result = subprocess.run(
            [python, "-c", _READ_ONLY_PROBE, str(STANDINS), str(root), str(done)],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["readable", f"PermissionError {root / 'lock'}"]
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(base)


# ------------------------------------------ docs/neuron-sdk.md#neuron_parallel_compile


def test_extract_then_parallel_compile(
    cache_root: Path,
    counter: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path_log = tmp_path / "cache_path_pid1_log.txt"
    monkeypatch.setenv("NEURON_EXTRACT_GRAPHS_ONLY", "1")
    monkeypatch.setenv("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG", str(path_log))
    monkeypatch.setenv("NEURON_CC_FLAGS", f"--cache_dir={cache_root} --model-type=transformer")
    caplog.set_level(logging.INFO, logger="libneuronxla")
    modules = [b"graph one", b"graph two NEFFCACHE_STANDIN_FAIL"]
    placeholders = {libneuronxla.neuron_xla_compile(m, []) for m in modules}
    assert placeholders == {neuron_cc_wrapper.EXTRACT_ONLY_PLACEHOLDER}
    assert compile_runs(counter) == 0
    assert path_log.read_text() == str(cache_root)
    entries = entry_dirs(cache_root)
    assert len(entries) == 2
    for entry in entries:
        assert sorted(p.name for p in entry.iterdir()) == [
            "compile_flags.json",
            "model.hlo_module.pb",
        ]
        assert (
            f"||NEURON_CC_WRAPPER||: Extracting graphs ({entry}/model.hlo_module.pb) for "
            "ahead-of-time parallel compilation. No compilation was done."
        ) in caplog.messages
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    todo = cache.get_hlos()[0]
    assert todo == [str(entry / "model.hlo_module.pb") for entry in entries]

    monkeypatch.delenv("NEURON_EXTRACT_GRAPHS_ONLY")
    run = subprocess.run(
        [sys.executable, str(PARALLEL_COMPILE), str(cache_root), "--workdir", str(tmp_path / "pc")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1, run.stderr  # exit code = number of failed compiles
    summary = json.loads(run.stdout)
    ok = [hlo for hlo, result in summary.items() if result["status"]]
    bad = [hlo for hlo, result in summary.items() if not result["status"]]
    assert len(ok) == len(bad) == 1
    assert set(summary[ok[0]]) == {"status", "retry", "compile_time"}
    assert compile_runs(counter) == 2
    good_entry, bad_entry = Path(ok[0]).parent, Path(bad[0]).parent
    assert (good_entry / "model.done").exists()
    assert (bad_entry / "model.log").exists()
    assert not (bad_entry / "model.neff").exists()
    assert not list(cache_root.rglob("*.lock"))

    # The real run now hits, and gets what an uncached compile of the same graph gives.
    good_module = (good_entry / "model.hlo_module.pb").read_bytes()
    hit = libneuronxla.neuron_xla_compile(good_module, [])
    assert compile_runs(counter) == 2
    assert hit == libneuronxla.neuron_xla_compile(good_module, [], use_cache=False)
    with pytest.raises(RuntimeError, match="Got a cached failed neff"):
        libneuronxla.neuron_xla_compile((bad_entry / "model.hlo_module.pb").read_bytes(), [])


def test_compile_cache_entry(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_EXTRACT_GRAPHS_ONLY", "1")
    libneuronxla.neuron_xla_compile(
        b"graph", ["--optlevel=2"], cache_dir=str(cache_root), platform_target="trn2"
    )
    monkeypatch.delenv("NEURON_EXTRACT_GRAPHS_ONLY")
    cache = create_compile_cache(CacheUrl(str(cache_root)))
    (hlo,) = cache.get_hlos()[0]
    entry = cache.try_lookup_for_compile(hlo)
    assert entry is not None
    with entry:
        assert not entry.exists
        status, retry = neuron_cc_wrapper.compile_cache_entry(str(tmp_path / "out.neff"), entry)
        assert entry.exists
    assert (status, retry) == (True, 0)
    assert (tmp_path / "out.neff").read_bytes() == libneuronxla.neuron_xla_compile(
        b"graph", ["--optlevel=2"], platform_target="trn2", use_cache=False
    )


# docs/neuron-sdk.md#when-the-cache-url-is-set: a trial run that sets the cache URL itself
# (NxD), and records what the tool put in its environment.
_TRIAL_RUN = """
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump({name: os.environ.get(name) for name in
               ("NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG")}, f)
os.environ["NEURON_COMPILE_CACHE_URL"] = sys.argv[2]
import libneuronxla
for module in (b"graph one", b"graph two"):
    libneuronxla.neuron_xla_compile(module, ["--model-type=transformer"])
"""


@pytest.mark.parametrize("path_log", ["url", "cache_path"])
def test_parallel_compile_hands_the_logged_path_to_its_pool(
    cache_root: Path, counter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_log: str
) -> None:
    """docs/neuron-sdk.md#neuron_parallel_compile and #neuron_parallel_compiles-environment:
    the trial run inherits NEURON_EXTRACT_GRAPHS_ONLY=1 and the path-log variable from
    the tool's own environment; the pool compiles in the cache the log names, not in the
    one the tool's environment names."""
    decoy = tmp_path / "decoy"
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(decoy))
    monkeypatch.setenv("NEFFCACHE_STANDIN_PATH_LOG", path_log)
    monkeypatch.setenv("PYTHONPATH", str(STANDINS))
    seen, workdir = tmp_path / "trial-env.json", tmp_path / "pc"
    trial = [sys.executable, "-c", _TRIAL_RUN, str(seen), str(cache_root)]
    run = subprocess.run(
        [sys.executable, str(PARALLEL_COMPILE), "--workdir", str(workdir), "--", *trial],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    trial_env = json.loads(seen.read_text())
    assert trial_env["NEURON_EXTRACT_GRAPHS_ONLY"] == "1"
    assert re.fullmatch(
        re.escape(str(workdir)) + r"/cache_path_pid[0-9]+_log\.txt",
        trial_env["NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"],
    )
    summary = json.loads(run.stdout)
    assert len(summary) == 2
    assert all(result["status"] for result in summary.values())
    assert compile_runs(counter) == 2
    assert all((entry / "model.done").exists() for entry in entry_dirs(cache_root))
    assert not decoy.exists()


def test_parallel_compile_leaves_extraction_on_for_its_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/neuron-sdk.md#neuron_parallel_compiles-environment: the trial run's variables
    are set in the tool's own environment and stay there, so the pool it forks afterwards
    inherits them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("standin_npc", PARALLEL_COMPILE)
    assert spec is not None
    assert spec.loader is not None
    npc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(npc)
    for name in ("NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"):
        monkeypatch.setenv(name, "")  # restored (unset) after the test
    code, logged = npc.run_train_script([sys.executable, "-c", "pass"], str(tmp_path))
    assert (code, logged) == (0, None)  # nothing compiled: no path logged
    assert os.environ["NEURON_EXTRACT_GRAPHS_ONLY"] == "1"
    assert os.environ["NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"].startswith(str(tmp_path))
    assert npc.ProcessPoolExecutor.__module__ == "concurrent.futures.process"


# --------------------- docs/neuron-sdk.md#the-sdk-in-late-2026-torchneuron-vllm-neuron

TORCHNEURON = STANDINS / "torchneuron_like.py"
VLLM = STANDINS / "vllm_neuron_like.py"
TRACE = STANDINS / "trace_like.py"
HLO_FIXTURE = STANDINS.parent / "fixtures" / "hlo" / "block_a.pb"
OTHER_HLO_FIXTURE = STANDINS.parent / "fixtures" / "hlo" / "variant_op.pb"
# docs/neuron-sdk.md#torchneurons-compiler-call: TorchNeuron's options, between the input
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
LIBNEURONXLA_OPTIONS = [
    ["--cache_dir=/var/tmp/neuron-compile-cache"],
    ["--cache_dir", "/var/tmp/neuron-compile-cache"],
    ["--cache_dir=neffcache+http://127.0.0.1:1/ns"],
    ["--no_cache"],
    ["--retry_failed_compilation"],
    ["--log_level=INFO"],
    ["--log_level", "INFO"],
    ["--dump=/tmp/dump"],
    ["--compile_workdir=/tmp/work"],
]


def _replace_option(options: list[str], old: str | list[str], new: list[str]) -> list[str]:
    """``options`` with ``old`` (a token, or a token and its value) replaced by ``new``."""
    old = [old] if isinstance(old, str) else old
    at = next(i for i in range(len(options)) if options[i : i + len(old)] == old)
    return [*options[:at], *new, *options[at + len(old) :]]


def test_torchneuron_argv_form_and_its_flags(tmp_path: Path) -> None:
    """docs/neuron-sdk.md#torchneurons-compiler-call: input first, options as separate
    words, -O2 without a value."""
    module = write_input(tmp_path / "module.mlir", b"ML\xefR\x00stablehlo bytecode")
    outs = itertools.count()

    def neff(input_file: Path, options: list[str] = TORCHNEURON_OPTIONS) -> bytes:
        out = tmp_path / f"out-{next(outs)}.neff"
        done = run_compiler("compile", str(input_file), *options, "--output", str(out))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "Compiler status PASS"
        return out.read_bytes()

    base = neff(module)
    assert base.startswith(MAGIC)
    assert neff(module) == base
    # Any name and any format: the NEFF is a function of the bytes.
    for name in ("module.hlo.pb", "graph.hlo", "model.pb", "no-extension"):
        assert neff(write_input(tmp_path / name, module.read_bytes())) == base, name
    # The --x=v and --x v spellings are one flag.
    assert neff(module, _replace_option(TORCHNEURON_OPTIONS, ["--lnc", "2"], ["--lnc=2"])) == base
    assert (
        neff(
            module,
            _replace_option(TORCHNEURON_OPTIONS, "--auto-cast=none", ["--auto-cast", "none"]),
        )
        == base
    )
    variants = {
        "-O1": _replace_option(TORCHNEURON_OPTIONS, "-O2", ["-O1"]),
        "--lnc 1": _replace_option(TORCHNEURON_OPTIONS, ["--lnc", "2"], ["--lnc", "1"]),
        "trn3": _replace_option(TORCHNEURON_OPTIONS, ["--target", "trn2"], ["--target", "trn3"]),
        "model-type": _replace_option(
            TORCHNEURON_OPTIONS, ["--model-type", "transformer"], ["--model-type", "generic"]
        ),
        "auto-cast": _replace_option(TORCHNEURON_OPTIONS, "--auto-cast=none", ["--auto-cast=all"]),
        "extra flag": [*TORCHNEURON_OPTIONS, "--enable-saturate-infinity"],
    }
    neffs = {name: neff(module, options) for name, options in variants.items()}
    assert base not in neffs.values()
    assert len(set(neffs.values())) == len(neffs)


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


TRACE_FILES = {
    "graph.hlo": b"hlo module bytes",
    "metadata.json": b'{"a": 1}',
    "weights/w0.npy": b"weights zero",
    "weights/w1.npy": b"weights one",
}


def test_directory_input(tmp_path: Path) -> None:
    """docs/neuron-sdk.md#torch-neuronx-tracing: a directory is the input; every file's
    relative name and bytes count."""
    outs = itertools.count()

    def neff(input_path: Path) -> bytes:
        out = tmp_path / f"out-{next(outs)}.neff"
        done = run_compiler(
            "compile",
            str(input_path),
            "--framework",
            "XLA",
            "--target",
            "trn1",
            "--output",
            str(out),
        )
        assert done.returncode == 0, done.stderr
        return out.read_bytes()

    base = neff(_tree(tmp_path / "a" / "model", TRACE_FILES))
    assert base.startswith(MAGIC)
    # Where the directory is does not count.
    assert neff(_tree(tmp_path / "elsewhere" / "model", TRACE_FILES)) == base
    assert neff(_tree(tmp_path / "other-name", TRACE_FILES)) == base
    # Empty subdirectories do not count.
    with_empty = _tree(tmp_path / "empty-sub", TRACE_FILES)
    (with_empty / "weights" / "empty").mkdir()
    assert neff(with_empty) == base
    variants = {
        "other weights": {**TRACE_FILES, "weights/w1.npy": b"weights One"},
        "renamed weight": {
            **{k: v for k, v in TRACE_FILES.items() if k != "weights/w1.npy"},
            "weights/w2.npy": b"weights one",
        },
        "moved weight": {
            **{k: v for k, v in TRACE_FILES.items() if k != "weights/w1.npy"},
            "weights/sub/w1.npy": b"weights one",
        },
        "extra file": {**TRACE_FILES, "weights/w3.npy": b"three"},
        "no metadata": {k: v for k, v in TRACE_FILES.items() if k != "metadata.json"},
        "other graph": {**TRACE_FILES, "graph.hlo": b"another hlo module"},
    }
    neffs = {
        name: neff(_tree(tmp_path / f"v{i}", files))
        for i, (name, files) in enumerate(variants.items())
    }
    assert base not in neffs.values()
    assert len(set(neffs.values())) == len(neffs)
    # The directory is not its graph file alone.
    assert neff(tmp_path / "a" / "model" / "graph.hlo") != base


def test_directory_input_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.neff"
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    done = run_compiler("compile", str(empty), "--output", str(out))
    assert done.returncode == 2
    assert "holds no file" in done.stderr
    failing = _tree(
        tmp_path / "failing", {**TRACE_FILES, "weights/w1.npy": b"x NEFFCACHE_STANDIN_FAIL"}
    )
    done = run_compiler("compile", str(failing), "--output", str(out))
    assert done.returncode == 70
    assert "NCC_STANDIN001" in done.stderr
    assert not out.exists()


def test_logfile_is_written_and_is_not_part_of_the_neff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/neuron-sdk.md#vllm-neuron: vLLM Neuron passes --logfile
    <wd>/log-neuron-cc.txt."""
    hlo = write_input(tmp_path / "graph.hlo", b"hlo")
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "log-neuron-cc.txt"
    common = ["--framework", "XLA", "--target", "trn2"]
    with_log, without_log = tmp_path / "with.neff", tmp_path / "without.neff"
    done = run_compiler(
        "compile", str(hlo), *common, "--output", str(with_log), "--logfile", str(log)
    )
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert "Compiler status PASS" in text.splitlines()
    assert f"compile {hlo} --framework XLA --target trn2 --output {with_log}" in text
    assert run_compiler("compile", str(hlo), *common, "--output", str(without_log)).returncode == 0
    assert with_log.read_bytes() == without_log.read_bytes()
    other = tmp_path / "other.neff"
    done = run_compiler(
        "compile", str(hlo), *common, f"--logfile={logs / 'other.txt'}", "--output", str(other)
    )
    assert done.returncode == 0, done.stderr
    assert other.read_bytes() == with_log.read_bytes()

    monkeypatch.setenv("NEFFCACHE_STANDIN_FAIL", "1")
    failed = tmp_path / "failed.neff"
    done = run_compiler(
        "compile", str(hlo), *common, "--output", str(failed), "--logfile", str(log)
    )
    assert done.returncode == 70
    assert "Compiler status ERROR" in log.read_text().splitlines()
    assert "NCC_STANDIN001" in log.read_text()
    monkeypatch.delenv("NEFFCACHE_STANDIN_FAIL")

    missing_dir = tmp_path / "missing" / "log.txt"
    done = run_compiler(
        "compile", str(hlo), *common, "--output", str(failed), "--logfile", str(missing_dir)
    )
    assert done.returncode == 2
    assert "error" in done.stderr
    assert not failed.exists()


@pytest.mark.parametrize("tokens", LIBNEURONXLA_OPTIONS, ids=lambda t: " ".join(t))
def test_libneuronxla_options_are_refused(tokens: list[str], tmp_path: Path) -> None:
    """docs/neuron-sdk.md#cache-location: libneuronxla parses these out; they never reach
    the compiler CLI."""
    hlo = write_input(tmp_path / "in.pb", b"hlo")
    out = tmp_path / "out.neff"
    done = run_compiler("compile", str(hlo), "--framework", "XLA", *tokens, "--output", str(out))
    assert done.returncode == 2
    assert "libneuronxla option" in done.stderr
    assert tokens[0].partition("=")[0] in done.stderr
    assert not out.exists()


def test_the_stand_in_libneuronxla_never_passes_its_options_on(
    counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "NEURON_CC_FLAGS",
        "--cache_dir=/nowhere --log_level=INFO --retry_failed_compilation --model-type=transformer",
    )
    assert libneuronxla.neuron_xla_compile(b"module", [], use_cache=False).startswith(MAGIC)
    assert compile_runs(counter) == 1


# --------------------------------------------------------------------------- callers (18)


def run_caller(
    script: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=60,
    )


def counter_argvs(counter: Path) -> list[list[str]]:
    """The compile invocations' argv (program name first), as the counter logged them."""
    return [line.split() for line in counter.read_text().splitlines() if " compile " in f"{line} "]


def test_torchneuron_like_compiles_every_time(tmp_path: Path, counter: Path) -> None:
    module = write_input(tmp_path / "module.bin", b"ML\xefR\x00stablehlo bytecode")
    tmp_root = tmp_path / "tmp-root"
    tmp_root.mkdir()
    neffs = []
    for i in range(2):
        out = tmp_path / f"{i}.neff"
        done = run_caller(
            TORCHNEURON, str(module), "--output-neff", str(out), "--tmp-root", str(tmp_root)
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["neff"] == str(out)
        neffs.append(out.read_bytes())
        assert list(tmp_root.iterdir()) == [], "the compile's temporary directory was left"
    assert neffs[0] == neffs[1]
    argvs = counter_argvs(counter)
    assert len(argvs) == 2
    for argv in argvs:
        # The argv of docs/neuron-sdk.md#torchneurons-compiler-call, in its order.
        assert argv[:2] == ["neuronx-cc", "compile"]
        work = Path(argv[2]).parent
        assert work.parent == tmp_root
        assert work.name.startswith("neuron_compile_")
        assert argv[2] == f"{work}/module.mlir"
        assert argv[3:-2] == TORCHNEURON_OPTIONS
        assert argv[-2:] == ["--output", f"{work}/module.neff"]
    assert argvs[0][2] != argvs[1][2], "mkdtemp gives each compile its own directory"
    # What the compiler makes of the same argv run directly.
    direct = tmp_path / "direct.neff"
    done = run_compiler("compile", str(module), *TORCHNEURON_OPTIONS, "--output", str(direct))
    assert done.returncode == 0, done.stderr
    assert direct.read_bytes() == neffs[0]

    out = tmp_path / "o1.neff"
    args = ["--output-neff", str(out), "--tmp-root", str(tmp_root)]
    done = run_caller(TORCHNEURON, str(module), *args, "--opt-level", "1", "--lnc", "1", "--hlo-pb")
    assert done.returncode == 0, done.stderr
    argv = counter_argvs(counter)[-1]
    assert argv[2].endswith("/module.hlo.pb")
    assert argv[3:-2] == _replace_option(
        _replace_option(TORCHNEURON_OPTIONS, "-O2", ["-O1"]), ["--lnc", "2"], ["--lnc", "1"]
    )
    assert out.read_bytes() != neffs[0]


def test_torchneuron_like_appends_neuron_cc_flags(
    tmp_path: Path, counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = write_input(tmp_path / "module.bin", b"ML\xefR\x00stablehlo bytecode")
    tmp_root = tmp_path / "tmp-root"
    tmp_root.mkdir()
    out = tmp_path / "out.neff"
    args = [str(module), "--output-neff", str(out), "--tmp-root", str(tmp_root)]
    monkeypatch.setenv(
        "NEURON_CC_FLAGS", "--enable-saturate-infinity --tensorizer-options='--a --b'"
    )
    done = run_caller(TORCHNEURON, *args)
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[-4:] == [
        "--enable-saturate-infinity",
        "--tensorizer-options=--a --b",
        "--output",
        str(Path(argv[2]).parent / "module.neff"),
    ]

    # An old libneuronxla setting left in NEURON_CC_FLAGS reaches the compiler, which
    # refuses it: the caller exits with the compiler's code and prints its stderr.
    monkeypatch.setenv(
        "NEURON_CC_FLAGS", "--cache_dir=neffcache+http://127.0.0.1:1/ns --log_level=INFO"
    )
    out.unlink()
    done = run_caller(TORCHNEURON, *args)
    assert done.returncode == 2
    assert "--cache_dir=neffcache+http://127.0.0.1:1/ns" in done.stderr
    assert not out.exists()
    assert list(tmp_root.iterdir()) == []

    monkeypatch.delenv("NEURON_CC_FLAGS")
    monkeypatch.setenv("NEFFCACHE_STANDIN_FAIL", "1")
    done = run_caller(TORCHNEURON, *args)
    assert done.returncode == 70
    assert "NCC_STANDIN001" in done.stderr
    assert not out.exists()
    assert list(tmp_root.iterdir()) == []


def _recording_compiler(bindir: Path, cwd_log: Path) -> None:
    """A ``neuronx-cc`` that logs its working directory, then runs the stand-in."""
    bindir.mkdir()
    script = bindir / "neuronx-cc"
    script.write_text(
        f'#!/bin/sh\npwd -P >> "{cwd_log}"\nexec "{sys.executable}" "{COMPILER}" "$@"\n'
    )
    script.chmod(0o755)


def test_vllm_neuron_like(tmp_path: Path, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd_log = tmp_path / "cwd.log"
    _recording_compiler(tmp_path / "bin", cwd_log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    caller_cwd = tmp_path / "caller-cwd"
    caller_cwd.mkdir()
    summaries = []
    for i in range(2):
        wd = tmp_path / f"wd{i}"
        done = run_caller(
            VLLM, str(HLO_FIXTURE), "--work-dir", str(wd), "--", "--lnc", "2", cwd=caller_cwd
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        summaries.append(summary)
        key = summary["key"]
        assert re.fullmatch(r"[0-9a-f]{32}", key)
        assert (wd / "graph.hlo").read_bytes() == HLO_FIXTURE.read_bytes()
        assert summary["argv"] == [
            "neuronx-cc",
            "compile",
            f"{wd}/graph.hlo",
            "--framework",
            "XLA",
            "--target",
            "trn2",
            "--output",
            f"{wd}/graph_{key}.neff",
            "--logfile",
            f"{wd}/log-neuron-cc.txt",
            "--lnc",
            "2",
        ]
        assert (wd / f"graph_{key}.neff").read_bytes().startswith(MAGIC)
        assert "Compiler status PASS" in (wd / "log-neuron-cc.txt").read_text()
    assert compile_runs(counter) == 2, "the stand-in has no cache of its own"
    assert summaries[0]["key"] == summaries[1]["key"]
    first = Path(summaries[0]["neff"]).read_bytes()
    assert Path(summaries[1]["neff"]).read_bytes() == first
    # No cwd argument: the compiler ran where the caller runs.
    assert cwd_log.read_text().splitlines() == [str(caller_cwd.resolve())] * 2

    other = run_caller(VLLM, str(OTHER_HLO_FIXTURE), "--work-dir", str(tmp_path / "wd-other"))
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["key"] != summaries[0]["key"]
    assert Path(json.loads(other.stdout)["neff"]).read_bytes() != first

    monkeypatch.setenv("NEFFCACHE_STANDIN_FAIL", "1")
    failed = run_caller(VLLM, str(HLO_FIXTURE), "--work-dir", str(tmp_path / "wd-failed"))
    assert failed.returncode == 70
    assert "NCC_STANDIN001" in failed.stderr


def test_vllm_neuron_like_needs_the_neff_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "neuronx-cc").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "neuronx-cc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    done = run_caller(VLLM, str(HLO_FIXTURE), "--work-dir", str(tmp_path / "wd"))
    assert done.returncode == 1
    assert "do not exist" in done.stderr


def _npy(path: Path) -> tuple[tuple[int, ...], bytes]:
    """(shape, raw data) of a little-endian float32 NPY 1.0 file, checked."""
    data = path.read_bytes()
    assert data[:8] == b"\x93NUMPY\x01\x00"
    header_len = int.from_bytes(data[8:10], "little")
    assert (10 + header_len) % 64 == 0
    header = ast.literal_eval(data[10 : 10 + header_len].decode("latin-1"))
    assert header["descr"] == "<f4"
    assert header["fortran_order"] is False
    shape = tuple(header["shape"])
    raw = data[10 + header_len :]
    assert len(raw) == 4 * math.prod(shape)
    return shape, raw


def test_trace_like(tmp_path: Path, counter: Path) -> None:
    def trace(workdir: Path, seed: int, graph: Path = HLO_FIXTURE) -> bytes:
        done = run_caller(TRACE, str(graph), "--workdir", str(workdir), "--weights-seed", str(seed))
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert summary["argv"] == [
            "neuronx-cc",
            "compile",
            str(workdir / "model"),
            "--framework",
            "XLA",
            "--target",
            "trn1",
            "--output",
            str(workdir / "graph.neff"),
        ]
        return (workdir / "graph.neff").read_bytes()

    first = trace(tmp_path / "a", 1)
    model = tmp_path / "a" / "model"
    assert sorted(str(p.relative_to(model)) for p in model.rglob("*") if p.is_file()) == [
        "graph.hlo",
        "metadata.json",
        "weights/w0.npy",
        "weights/w1.npy",
    ]
    assert (model / "graph.hlo").read_bytes() == HLO_FIXTURE.read_bytes()
    json.loads((model / "metadata.json").read_text())
    shapes = {name: _npy(model / "weights" / name)[0] for name in ("w0.npy", "w1.npy")}
    assert shapes == {"w0.npy": (4, 4), "w1.npy": (4,)}
    # The NEFF is what the compiler makes of the directory.
    direct = tmp_path / "direct.neff"
    assert (
        run_compiler("compile", str(model), "--target=trn1", "--output", str(direct)).returncode
        == 0
    )
    assert direct.read_bytes() == first

    assert trace(tmp_path / "b", 1) == first, "another workdir, same model: same NEFF"
    assert _npy(tmp_path / "b" / "model" / "weights" / "w0.npy") == _npy(
        model / "weights" / "w0.npy"
    )
    assert trace(tmp_path / "c", 2) != first, "other weights: another NEFF"
    assert (
        _npy(tmp_path / "c" / "model" / "weights" / "w0.npy")[1]
        != _npy(model / "weights" / "w0.npy")[1]
    )
    assert trace(tmp_path / "d", 1, OTHER_HLO_FIXTURE) != first
    assert compile_runs(counter) == 5
