"""A free loopback port, and the wait for a server started on it, for the tests that
start servers (imported as ``loopback``)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

import httpx


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
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1, trust_env=False).is_success:
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
