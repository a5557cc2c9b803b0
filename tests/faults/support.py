"""Helpers the fault tests share (imported as ``faults.support``): a real ``neffcache
serve`` (support/served.py's) over a filesystem blob store and a SQLite index, or the
stores its settings name, and a raw HTTP/1.1 request for bodies no client sends."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from support.served import NEFFCACHE, Server, digest

__all__ = [
    "NEFFCACHE",
    "Server",
    "answer_status",
    "digest",
    "raw_request",
    "running_server",
    "running_server_with",
]


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
    env = {f"NEFFCACHE_{name.upper()}": value for name, value in settings.items()}
    with Server(data_dir, env) as server:
        yield server
