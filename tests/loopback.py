"""A free loopback port, for the tests that start servers (imported as ``loopback``)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago (the OS picked it; the socket is
    closed again, so nothing listens on it until a test starts something there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
