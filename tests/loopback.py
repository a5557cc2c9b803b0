"""A free loopback port, the waits for a server started on it, the Redis the suites run
against, and uvicorn in a thread, for the tests (and benchmarks) that start servers
(imported as ``loopback``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picked it; the socket is
    closed again, so nothing listens on it until a test starts something there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(process: subprocess.Popen[bytes], url: str, seconds: float = 30.0) -> bool:
    """Whether ``GET {url}/healthz`` answered 2xx within ``seconds`` while ``process``
    (a ``neffcache serve`` a test started) kept running: the start-up wait of every
    test that starts a server. On False the caller stops it and shows its log."""
    deadline = time.monotonic() + seconds
    # One client, no certificates: loading them takes a tenth of a second and more on
    # a loaded machine, once per client, for plain http.
    with httpx.Client(timeout=1, trust_env=False, verify=False) as http:
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if http.get(f"{url}/healthz").is_success:
                    return True
            time.sleep(0.05)
    return False


def terminate(process: subprocess.Popen[bytes], seconds: float = 10.0) -> None:
    """Stop a server a test started: SIGTERM (a clean shutdown), SIGKILL after
    ``seconds``; waits for it either way, so no zombie outlives the test."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


def real_redis() -> str | None:
    """The ``redis-server`` binary the Redis suites run against, or None when they run
    against fakeredis instead: no binary on PATH (or ``NEFFCACHE_TEST_FAKEREDIS=1``)
    outside CI. Under ``CI`` the real server is required (the caller fails the test)."""
    if os.environ.get("NEFFCACHE_TEST_FAKEREDIS") == "1" and not os.environ.get("CI"):
        return None
    return shutil.which("redis-server")


def uses_fakeredis() -> bool:
    return real_redis() is None and not os.environ.get("CI")


def redis_argv(port: int, workdir: Path) -> list[str]:
    """The command that serves Redis on the loopback ``port``: a real ``redis-server``
    that persists nothing, else (see ``real_redis``) fakeredis."""
    exe = real_redis()
    if exe is not None:
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        return [*argv, "no", "--dir", str(workdir)]  # --dir: in case anything is written
    if os.environ.get("CI"):
        raise RuntimeError(
            "redis-server is not on PATH; under CI the Redis suites need the real server "
            "(apt-get install redis-server; .ci/run installs it)"
        )
    return [sys.executable, str(Path(__file__).with_name("fake_redis_server.py")), str(port)]


def redis_ready(port: int) -> bool:
    """Whether a ``redis-server`` on the loopback ``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # RESP, as fakeredis reads only that
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class InThread:
    """uvicorn serving ``app`` on a free loopback port, in a daemon thread; entered, it
    gives the base URL once the server accepts connections."""

    def __init__(self, app: Any, **options: Any) -> None:
        """``options``: uvicorn.Config's, beyond the host, port and log level."""
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the test server did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
