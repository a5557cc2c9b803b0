"""Black-box harness for the client's end-to-end tests (test_e2e_*.py).

Nothing here imports ``neffcache.client``: the client is driven only as processes
(``python -m neffcache.client.cli ...``, the ``neuronx-cc`` in ``neffcache shim-dir``,
and a training-like script that imports the stand-in ``libneuronxla``), through
environment variables, files and a real ``neffcache serve`` process.

Conventions every test relies on:

* Children never inherit ``NEURON_*``, ``NEFFCACHE_*``, ``XLA_FLAGS``, ``PYTHONPATH``,
  ``TMPDIR`` or proxy variables from the outer environment; :meth:`Sandbox.env` sets
  exactly what a test asks for, always with a private ``NEFFCACHE_LOCAL_DIR``.
* Every child runs in its own session with stdout/stderr in files (not pipes), so a
  deadline can kill the child and anything it started, and nothing blocks on a pipe.
* The stand-in compiler counts its invocations in ``Sandbox.counter``; a compile is a
  line whose argv contains the word ``compile``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import blake3
import httpx

from neffcache.protocol import inline
from support import served

TESTS = Path(__file__).resolve().parent.parent
STANDINS = TESTS / "standins"
COMPILER = STANDINS / "neuronx-cc"
HLO_DIR = TESTS / "fixtures" / "hlo"
TRAIN_SCRIPT = TESTS / "client" / "train_like.py"
NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]
PYTHON_BIN = Path(sys.executable).parent

# The same JAX program traced twice with different file/function names and metadata
# (tests/fixtures/hlo/jax.json, group "block"), and a different program.
BLOCK_A = "block_a"
BLOCK_B = "block_b_renamed"
VARIANT = "variant_shape"
OTHER = "variant_op"

# The stand-in compiler's default version (tests/standins/neuronx-cc).
STANDIN_VERSION = "2.20.9961.0+0acef03a"
TARGET = "trn1"
USER_FLAGS = ("--model-type=transformer",)
# docs/neuron-sdk.md#flags-hash: md5(json.dumps(["--target=trn1",
# "--model-type=transformer"]))[:8], the stock flags hash the stand-in libneuronxla
# computes for the training-like script.
STOCK_FLAGS_HASH = "3cc9a3cb"
STANDIN_NEFF_SIZE = 4096
HEX64 = re.compile(r"[0-9a-f]{64}")

_LEAKY_PREFIXES = ("NEFFCACHE_", "NEURON_")
_LEAKY_NAMES = frozenset(
    {
        "XLA_FLAGS",
        "PYTHONPATH",
        "TMPDIR",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    }
)


# --- environments ---------------------------------------------------------------------


def clean_environ() -> dict[str, str]:
    """``os.environ`` without anything that could configure Neuron, neffcache, the
    stand-ins or a proxy; loopback is never proxied."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_LEAKY_PREFIXES) and name not in _LEAKY_NAMES
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def search_path(*first: Path) -> str:
    """``first``, then this interpreter's directory (the stand-ins' ``python3``), then
    the outer PATH minus any directory holding a ``neuronx-cc`` (no real one leaks in)."""
    outer = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "neuronx-cc").exists()
    ]
    return os.pathsep.join([*(str(d) for d in first), str(PYTHON_BIN), *outer])


def cache_url(port: int, namespace: str) -> str:
    return f"neffcache+http://127.0.0.1:{port}/{namespace}"


# --- fixtures' bytes and addresses ----------------------------------------------------


def hlo(name: str) -> Path:
    return HLO_DIR / f"{name}.pb"


def blake3_hex(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def stock_address(name: str) -> str:
    """The stock Neuron address the stand-in libneuronxla gives ``name`` when the
    training-like script compiles it: its module key is the first 8 bytes of sha256 of
    the module, as a decimal number (tests/standins/libneuronxla/neuron_cc_wrapper.py)."""
    digest = hashlib.sha256(hlo(name).read_bytes()).digest()
    module_key = int.from_bytes(digest[:8], "big")
    return f"neuronxcc-{STANDIN_VERSION}/MODULE_{module_key}+{STOCK_FLAGS_HASH}"


@functools.cache
def reference_neff(name: str) -> bytes:
    """What the stand-in compiler makes of ``name`` for trn1 with USER_FLAGS, compiled
    here directly, with no neffcache anywhere."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "reference.neff"
        argv = [sys.executable, str(COMPILER), *compile_args(hlo(name), out)]
        done = subprocess.run(
            argv, env=clean_environ(), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return out.read_bytes()


def compile_args(input_file: Path, output: Path, *, output_form: str = "separate") -> list[str]:
    """``compile --framework=XLA IN --output OUT --target=trn1 --model-type=transformer``
    (``output_form="equals"`` writes ``--output=OUT``)."""
    out = [f"--output={output}"] if output_form == "equals" else ["--output", str(output)]
    return ["compile", "--framework=XLA", str(input_file), *out, f"--target={TARGET}", *USER_FLAGS]


@functools.cache
def canonical_key(name: str) -> str:
    """The key ``neffcache key`` gives ``name`` with the stand-in compiler on PATH, for
    the target and flags the wrapper tests compile with."""
    env = clean_environ()
    env["PATH"] = search_path(STANDINS)
    done = subprocess.run(
        [*NEFFCACHE, "key", str(hlo(name)), "--target", TARGET, "--", *USER_FLAGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


@functools.cache
def shim_dir() -> Path:
    """The directory ``neffcache shim-dir`` prints (one line on stdout), checked to
    hold an executable ``neuronx-cc``."""
    done = subprocess.run(
        [*NEFFCACHE, "shim-dir"],
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"neffcache shim-dir failed: {done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"neffcache shim-dir printed {done.stdout!r}"
    directory = Path(lines[0])
    shim = directory / "neuronx-cc"
    assert shim.is_file(), f"{shim} does not exist"
    assert os.access(shim, os.X_OK), f"{shim} is not executable"
    return directory


# --- processes ------------------------------------------------------------------------


@dataclass
class Done:
    """A finished (or deadline-killed: ``returncode is None``) child process."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        status = "killed at its deadline" if self.timed_out else f"exit {self.returncode}"
        return (
            f"{self.argv!r}: {status} after {self.seconds:.2f} s\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )

    def check(self) -> Done:
        assert self.returncode == 0, self.describe()
        return self


class Running:
    """A child in its own session, output in files; :meth:`kill` ends its group."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_stem: Path
    ) -> None:
        self.argv = list(argv)
        self._out_path = log_stem.with_suffix(".out")
        self._err_path = log_stem.with_suffix(".err")
        self.started = time.monotonic()
        with self._out_path.open("wb") as out, self._err_path.open("wb") as err:
            self.process = subprocess.Popen(
                self.argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self._done: Done | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float) -> Done:
        """Wait up to ``timeout`` seconds; past it, kill the group and report it."""
        if self._done is not None:
            return self._done
        try:
            code: int | None = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        seconds = time.monotonic() - self.started
        self._done = Done(
            self.argv,
            code,
            self._out_path.read_text(errors="replace"),
            self._err_path.read_text(errors="replace"),
            seconds,
        )
        return self._done

    def kill(self) -> None:
        """SIGKILL the child's process group (the child and what it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02
) -> None:
    """Poll ``predicate()`` until it is true; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Training:
    """A finished run of train_like.py: one record per graph, and the NEFFs."""

    done: Done
    graphs: list[dict[str, Any]]
    neffs: list[bytes]


def read_training(done: Done, out: Path, names: Sequence[str]) -> Training:
    graphs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    neffs = [
        (out / f"{i}-{name}.neff").read_bytes()
        for i, name in enumerate(names)
        if (out / f"{i}-{name}.neff").exists()
    ]
    return Training(done, graphs, neffs)


@dataclass
class Sandbox:
    """Per-test directories, the compile counter, environments and process launchers."""

    root: Path
    namespace: str
    running: list[Running] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    @property
    def counter(self) -> Path:
        return self.root / "compiler-invocations.log"

    def new_dir(self, name: str) -> Path:
        path = self.root / f"{name}-{next(self._ids)}"
        path.mkdir(parents=True)
        return path

    def invocations(self) -> list[str]:
        if not self.counter.exists():
            return []
        return self.counter.read_text().splitlines()

    def compiles(self, mentioning: str | Path | None = None) -> int:
        """Compile invocations so far (those whose argv mentions ``mentioning``)."""
        return sum(
            1
            for line in self.invocations()
            if "compile" in line.split()[1:] and (mentioning is None or str(mentioning) in line)
        )

    def env(
        self,
        *,
        l1: Path,
        url: str | None = None,
        url_var: str = "NEURON_COMPILE_CACHE_URL",
        shim: bool = False,
        hook: bool = False,
        real_compiler_on_path: bool = True,
        extra: Mapping[str, str | None] | None = None,
    ) -> dict[str, str]:
        """A child environment. ``url`` goes into ``url_var`` (``NEURON_CC_FLAGS`` gets
        ``--cache_dir=URL``). ``shim`` puts the shim directory first on PATH; the
        stand-in compiler follows unless ``real_compiler_on_path`` is false. ``hook``
        puts the stand-in ``libneuronxla`` on PYTHONPATH. ``extra`` sets variables
        (``None`` unsets)."""
        env = clean_environ()
        dirs = [shim_dir()] if shim else []
        if real_compiler_on_path:
            dirs.append(STANDINS)
        env["PATH"] = search_path(*dirs)
        env["NEFFCACHE_LOCAL_DIR"] = str(l1)
        # No hit daemon (a process that outlives the test) unless a test asks for one
        # (daemon_env): its own directory, and stopped when the test ends.
        env["NEFFCACHE_DAEMON"] = "0"
        env["NEFFCACHE_STANDIN_COUNTER"] = str(self.counter)
        # A stock entry lock left behind must fail a test, never hang it.
        env["NEFFCACHE_STANDIN_LOCK_TIMEOUT"] = "20"
        # The stand-in libneuronxla's work directories go under TMPDIR: one per run.
        env["TMPDIR"] = str(self.new_dir("tmp"))
        if hook:
            env["PYTHONPATH"] = str(STANDINS)
        if url is not None:
            if url_var == "NEURON_CC_FLAGS":
                env["NEURON_CC_FLAGS"] = f"--cache_dir={url}"
            else:
                env[url_var] = url
        for name, value in (extra or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
    ) -> Running:
        log_stem = self.root / "logs" / f"proc-{next(self._ids)}"
        log_stem.parent.mkdir(exist_ok=True)
        running = Running(argv, env, cwd or self.new_dir("cwd"), log_stem)
        self.running.append(running)
        return running

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None = None,
        timeout: float = 60,
    ) -> Done:
        return self.start(argv, env, cwd).wait(timeout)

    # The wrapper, as `neffcache wrap -- neuronx-cc ...` or through the shim on PATH.

    def wrap_argv(self, name: str, out: Path, *, via_shim: bool = False, **kw: str) -> list[str]:
        args = compile_args(hlo(name), out, **kw)
        if via_shim:
            return ["neuronx-cc", *args]
        return [*NEFFCACHE, "wrap", "--", "neuronx-cc", *args]

    def wrap(
        self,
        env: Mapping[str, str],
        name: str,
        out: Path,
        *,
        via_shim: bool = False,
        timeout: float = 60,
        **kw: str,
    ) -> Done:
        return self.run(self.wrap_argv(name, out, via_shim=via_shim, **kw), env, timeout=timeout)

    # The training-like script (interception point 1, and 2 when the shim is on PATH).

    def train_argv(self, names: Sequence[str], out: Path, *extra: str) -> list[str]:
        return [
            sys.executable,
            str(TRAIN_SCRIPT),
            "--out",
            str(out),
            *extra,
            *(str(hlo(name)) for name in names),
        ]

    def train(
        self,
        env: Mapping[str, str],
        names: Sequence[str],
        *,
        cwd: Path | None = None,
        timeout: float = 90,
    ) -> Training:
        out = self.new_dir("neffs")
        done = self.run(self.train_argv(names, out), env, cwd=cwd, timeout=timeout)
        return read_training(done, out, names)

    def kill_all(self) -> None:
        for running in self.running:
            if running.poll() is None:
                running.kill()


# --- the run manifest -----------------------------------------------------------------

MANIFEST_FIELDS = frozenset(
    {"key", "neuron_address", "result", "source", "fetch_seconds", "compile_seconds", "bytes"}
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_run_manifest(path: Path) -> list[dict[str, Any]]:
    """Every line of a run manifest, each checked against the documented fields."""
    assert path.exists(), f"no run manifest at {path}"
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        assert isinstance(record, dict), line
        missing = MANIFEST_FIELDS - record.keys()
        assert not missing, f"manifest line lacks {sorted(missing)}: {line}"
        key = record["key"]
        assert key is None or HEX64.fullmatch(key), line
        assert record["neuron_address"] is None or isinstance(record["neuron_address"], str)
        assert record["result"] in ("hit", "miss", "delegated"), line
        assert record["source"] in ("l1", "server", "compiler", "wrapper"), line
        assert (record["result"] == "miss") == (record["source"] == "compiler"), line
        # The hook's line for a graph the wrapper's shim resolved, and only it.
        delegated = record["result"] == "delegated"
        assert delegated == (record["source"] == "wrapper"), line
        assert delegated == (record.get("resolved_by") == "wrapper"), line
        assert not delegated or record["via"] == "hook", line
        assert _is_number(record["fetch_seconds"]), line
        assert record["fetch_seconds"] >= 0, line
        compile_seconds = record["compile_seconds"]
        assert compile_seconds is None or _is_number(compile_seconds), line
        assert isinstance(record["bytes"], int), line
        assert not isinstance(record["bytes"], bool), line
        records.append(record)
    return records


# --- servers --------------------------------------------------------------------------


class Server(served.Server):
    """``neffcache serve`` (support/served.py's) on a free loopback port, in the
    environment the children get (``clean_environ``): no tokens, anonymous allowed."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, environ=clean_environ())


class SilentServer:
    """Accepts TCP connections on a loopback port and never answers on them."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.05)
        self.port: int = self._sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()


_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
    }
)


def _read_chunked(stream: io.BufferedIOBase) -> bytes:
    body = bytearray()
    while True:
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline() not in (b"\r\n", b"\n", b""):
                pass
            return bytes(body)
        body += stream.read(size)
        stream.readline()


def _blob_bytes_start(command: str, path: str, upstream: httpx.Response) -> int | None:
    """Where a blob's bytes begin in an answer that carries one: a blob GET's body, or
    the file after a lookup's JSON in an inline answer (protocol/inline.py)."""
    if command != "GET" or upstream.status_code not in (200, 206):
        return None
    if path.startswith("/v1/blobs/"):
        return 0
    if upstream.headers.get("content-type") != inline.MEDIA_TYPE:
        return None
    parts = inline.split(upstream.content)
    return None if parts is None else len(upstream.content) - len(parts[1])


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _forward(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = _read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            upstream = self.server.upstream.request(
                self.command, self.path, content=body, headers=headers
            )
        except httpx.HTTPError:
            self.send_error(502)
            return
        data = upstream.content
        start = _blob_bytes_start(self.command, self.path, upstream)
        if start is not None and len(data) > start:
            flipped = bytearray(data)
            flipped[start + (len(flipped) - start) // 2] ^= 0xFF
            data = bytes(flipped)
            self.server.corrupted += 1
        self.send_response(upstream.status_code)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP | {"date", "server"}:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", upstream.headers.get("content-length", "0"))
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815


class _ProxyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    upstream: httpx.Client
    corrupted: int

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client closing its keep-alive connection is not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CorruptingProxy:
    """An HTTP proxy to a real server that flips one byte in the middle of every
    blob it passes on (the body of GET /v1/blobs/..., the file in a lookup's inline
    answer), and forwards everything else as is."""

    def __init__(self, upstream: str) -> None:
        self._server = _ProxyHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.upstream = httpx.Client(base_url=upstream, timeout=30, trust_env=False)
        self._server.corrupted = 0
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def corrupted(self) -> int:
        return self._server.corrupted

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server.upstream.close()


def copy_compiler(directory: Path) -> Path:
    """A copy of the stand-in compiler as ``directory/neuronx-cc``."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "neuronx-cc"
    shutil.copy2(COMPILER, target)
    return target
