"""Helpers the fault tests share (imported as ``faults.support``): a real ``neffcache
serve`` on a free loopback port over a filesystem blob store and a SQLite index, what
its staging directory holds, and a raw HTTP/1.1 request for bodies no client sends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import httpx
from loopback import free_port, terminate, wait_healthy

NEFFCACHE = [sys.executable, "-m", "neffcache.client.cli"]


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


class Server:
    """``neffcache serve --data-dir DATA``: blobs under ``DATA`` (file://), the index in
    ``DATA/index.db`` (SQLite), no tokens (protected mode, loopback only)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, timeout=30, trust_env=False)
        self.log = data_dir.parent / f"server-{self.port}.log"  # its stderr

    def blob_path(self, key: str) -> Path:
        return self.data_dir / "blobs" / key[:2] / key

    def staged(self) -> list[Path]:
        """Every upload file in the store's staging areas (``staging/<area>/uploads``)."""
        return sorted(self.data_dir.glob("staging/*/uploads/*"))

    def wait_until_unstaged(self, timeout: float = 5.0) -> list[Path]:
        """The staging files still there after up to ``timeout`` s (a request the client
        abandoned is cleaned up when the server notices the disconnect)."""
        deadline = time.monotonic() + timeout
        while (left := self.staged()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return left


@contextlib.contextmanager
def running_server(data_dir: Path) -> Iterator[Server]:
    """``neffcache serve`` on the embedded defaults (see ``running_server_with``)."""
    with running_server_with(data_dir) as server:
        yield server


def raw_request(
    port: int,
    head: str,
    body: bytes = b"",
    *,
    end: str = "read",
) -> int | None:
    """Send ``head`` (the request line and headers, without the blank line) and ``body``
    on a fresh socket, exactly as given; return the first answer's status, or None when
    the server closed without one.

    ``end`` is what the client does after the body: ``read`` (wait for the answer),
    ``shut`` (half-close: it will send nothing more, then read) or ``close`` (hang up
    without reading: a client that died mid-upload)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
        if end == "close":
            return None
        if end == "shut":
            sock.shutdown(socket.SHUT_WR)
        return answer_status(sock)


def answer_status(sock: socket.socket) -> int | None:
    """The status of the answer arriving on ``sock``: its first line read (until the
    server closes or resets), or None when none came."""
    answer = b""
    try:
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    except ConnectionResetError:
        return None
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else None


@contextlib.contextmanager
def running_server_with(data_dir: Path, **settings: str) -> Iterator[Server]:
    """``running_server`` with settings: each ``name=value`` becomes ``NEFFCACHE_<NAME>``
    in the server's environment (``index_url="redis://..."``, ``blob_grace_seconds="0"``).
    Its other variables are this process's, so a test's AWS endpoint reaches it."""
    server = Server(data_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_")}
    env.update({f"NEFFCACHE_{name.upper()}": value for name, value in settings.items()})
    argv = [*NEFFCACHE, "serve", "--port", str(server.port), "--data-dir", str(data_dir)]
    with open(server.log, "ab") as out:
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out
        )
    try:
        if not wait_healthy(process, server.url):
            raise AssertionError(f"neffcache serve did not start:\n{server.log.read_text()}")
        yield server
    finally:
        server.http.close()
        terminate(process)
