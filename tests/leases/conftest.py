"""Compile leases through the hook and the wrapper, against a real ``neffcache serve``
with short leases. Fixtures: the server (tests/herd.py's server); the helpers the
modules share (a client config pointing at it, a peek at a lease, this run's stock
address) are in tests/support/lease_hosts.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.client_units import closing_remotes
from support.lease_hosts import TTL

from neffcache.client import remote as remote_module
from neffcache.client.lease import reset_shared_leases


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    from herd import lease_server

    root = tmp_path / "server"
    root.mkdir()
    running = lease_server(root, TTL)
    yield running.url
    running.kill()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No server marked down at the start; every Remote's connection closed at the end."""
    monkeypatch.setattr(remote_module, "_down_until", {})
    with closing_remotes(monkeypatch):
        yield
        reset_shared_leases()
