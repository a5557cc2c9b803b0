"""One run of one stack for ``neffcache doctor --live``: its directories and
environment, the child process (``live_child``) within its timeout, and what the run
left behind.

Every run starts from nothing a job or an earlier run left: under one temporary root
it gets its own L1 (``NEFFCACHE_LOCAL_DIR``), ``TMPDIR``, the stacks' own caches
(TorchNeuron's NEFF cache and its locks, vLLM Neuron's cache root; vLLM Neuron's
shared tier unset), a working directory (vLLM Neuron runs the compiler in it) and a
run manifest (``NEFFCACHE_RUN_MANIFEST``). A hit can then only come from the server.
The rest of the environment is the doctor's, which is the job's: its URL, token,
``PATH``, ``PYTHONPATH`` and flags. Entries are labelled with the model
``neffcache-doctor-live`` (``NEFFCACHE_MODEL``).

The real compiler's argv is recorded when the shim is first on ``PATH``:
``NEFFCACHE_REAL_COMPILER`` then names a recorder that appends its argv to a file and
executes the compiler the shim would have run, so the shim runs the recorder in the
real compiler's place. Without the shim first, nothing stands between the stack and
its compiler, and the argv is not recorded.

The child runs in its own session, its output in a file: at its timeout its whole
process group (the shim, the compiler) is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from neffcache.client.doctor import live_child

MODEL = "neffcache-doctor-live"
# How long one tiny compile may take, the stack's import and the compiler's start
# included (tens of seconds on a real host; vLLM's import alone takes several).
CHILD_TIMEOUT = 300.0
# Lines of a run's output kept for a failure's evidence, from its last bytes read.
TAIL_LINES = 12
OUTPUT_KEPT = 64 << 10
# The settings a job's own caches take; each run gets fresh ones.
_FRESH_DIRS = {
    "NEFFCACHE_LOCAL_DIR": "l1",
    "TMPDIR": "tmp",
    "TORCH_NEURONX_NEFF_CACHE_DIR": "torchneuron-neff-cache",
    "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": "torchneuron-locks",
    "VLLM_CACHE_ROOT": "vllm-cache",
}
_UNSET = ("NEURON_LIBTORCH_REMOTE_CACHE",)
_RECORDER = """#!/bin/sh
'''exec' {python} -S -E "$0" "$@"
' '''
# neffcache doctor --live: the real compiler's argv, recorded; then the real compiler.
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


class Run(NamedTuple):
    """What one run did. ``code`` None: killed at ``timeout``."""

    code: int | None
    seconds: float
    timeout: float
    reply: dict[str, Any]  # live_child's answer ({} when it gave none)
    tail: list[str]  # the last lines of its output
    graphs: list[dict[str, Any]]  # its run manifest's lines
    calls: list[dict[str, Any]]  # the SDK's calls on the hook's cache, in order
    compiler: list[list[str]] | None  # the real compiler's argv per call (None: unseen)

    @property
    def status(self) -> str:
        """``ok``, ``unavailable``, ``error`` or ``killed``."""
        if self.code is None:
            return "killed"
        return str(self.reply.get("status") or ("ok" if self.code == 0 else "error"))

    def compiles(self) -> list[list[str]]:
        """The argv of each call of the real compiler that compiled."""
        return [argv for argv in self.compiler or [] if "compile" in argv]


def run(
    environ: Mapping[str, str],
    where: Path,
    stack: str,
    seed: int,
    timeout: float,
    real_compiler: str | None,
) -> Run:
    """Run ``stack``'s driver once in ``where`` (made here, fresh)."""
    where.mkdir(parents=True)
    env = _environment(environ, where)
    argv_log = where / "compiler-argv.jsonl"
    if real_compiler is not None:
        env["NEFFCACHE_REAL_COMPILER"] = _recorder(where, real_compiler, argv_log)
    calls = where / "cache-calls.jsonl"
    command = [sys.executable, "-m", live_child.__name__, stack, str(seed), str(calls)]
    code, seconds, output = _child(command, env, where / "work", where / "output.txt", timeout)
    return Run(
        code,
        seconds,
        timeout,
        _reply(output),
        _tail(output),
        _lines(Path(env["NEFFCACHE_RUN_MANIFEST"])),
        sorted(_lines(calls), key=lambda c: (c.get("t", 0), c.get("pid", 0))),
        [a for a in _lines(argv_log) if isinstance(a, list)] if real_compiler else None,
    )


def _environment(environ: Mapping[str, str], where: Path) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in _UNSET}
    for name, directory in (*_FRESH_DIRS.items(), ("", "work")):
        (where / directory).mkdir()
        if name:
            env[name] = str(where / directory)
    env["NEFFCACHE_RUN_MANIFEST"] = str(where / "run-manifest.jsonl")
    env["NEFFCACHE_MODEL"] = MODEL
    env["PYTHONUNBUFFERED"] = "1"  # the output's tail is what happened last
    return env


def _recorder(where: Path, real: str, log: Path) -> str:
    """A recorder standing in for ``real`` (pip's ``/bin/sh`` trampoline: a venv's
    Python path may be longer than a ``#!`` line takes)."""
    path = where / "bin" / "neuronx-cc"
    path.parent.mkdir()
    python = shlex.quote(sys.executable)
    path.write_text(_RECORDER.format(python=python, log=str(log), real=real))
    path.chmod(0o755)
    return str(path)


def _child(
    command: list[str], env: dict[str, str], cwd: Path, out: Path, timeout: float
) -> tuple[int | None, float, str]:
    began = time.monotonic()
    with open(out, "wb") as sink:
        child = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = child.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            code = None
            # What it started (the shim, a compiler) goes with it. After a normal exit
            # the group is left alone: the shim's telemetry sender ends by itself.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return code, round(time.monotonic() - began, 3), _end_of(out)


def _end_of(path: Path) -> str:
    """The file's last ``OUTPUT_KEPT`` bytes: a stack's log may be long, and what
    matters (the child's answer, the error) comes last."""
    with open(path, "rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - OUTPUT_KEPT, 0))
        return f.read().decode("utf-8", "replace")


def _reply(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(live_child.MARK):
            try:
                reply = json.loads(line[len(live_child.MARK) :])
            except ValueError:
                break
            return reply if isinstance(reply, dict) else {}
    return {}


def _tail(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.strip()]
    return [line for line in lines if not line.startswith(live_child.MARK)][-TAIL_LINES:]


def _lines(path: Path) -> list[Any]:
    """A JSON-lines file's values; a line that does not parse is skipped."""
    try:
        text = path.read_text("utf-8", "replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found
