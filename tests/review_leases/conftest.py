"""Fixtures for the review of compile leases: the session's Redis (from the server
tests) and a real ``neffcache serve`` with a short lease TTL (tests/herd.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from herd import _Server
from server.conftest import redis_server  # noqa: F401 (a fixture, re-exported)

TTL = 1.5  # seconds: the server's lease_ttl_seconds in ``short_ttl_server``


@pytest.fixture
def short_ttl_server(tmp_path: Path) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a server whose leases live ``TTL`` seconds."""
    root = tmp_path / "server"
    root.mkdir()
    server = _Server(root, TTL)
    yield server.url
    server.stop()
