"""Compile leases through the hook and the wrapper, against a real ``neffcache serve``
with short leases. Fixtures: the server
(tests/herd.py's server), a client config pointing at it, and hook Cores that play
one host each (their own L1, their own holder name)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client.unit_support import closing_remotes

from neffcache.client import remote as remote_module
from neffcache.client.config import ClientConfig
from neffcache.client.lease import reset_shared_leases

NS = "leases"
# Seconds: lease_ttl_seconds of ``server``.
TTL = 1.5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    from herd import _Server

    root = tmp_path / "server"
    root.mkdir()
    running = _Server(root, TTL)
    yield running.url
    running.stop()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No server marked down at the start; every Remote's connection closed at the end."""
    monkeypatch.setattr(remote_module, "_down_until", {})
    with closing_remotes(monkeypatch):
        yield
        reset_shared_leases()


def make_config(url: str, l1: Path | str, **extra: str) -> ClientConfig:
    env = {
        "NEFFCACHE_URL": f"neffcache+{url}/{NS}",
        "NEFFCACHE_LOCAL_DIR": str(l1),
        "NEFFCACHE_TIMEOUT": "5",
        **extra,
    }
    made = ClientConfig.from_env(env)
    assert made is not None
    return made


def peek(url: str, name: str) -> dict[str, Any]:
    """What another host sees of a lease, without taking it."""
    import httpx

    seen: dict[str, Any] = httpx.post(
        f"{url}/v1/ns/{NS}/leases/{name}",
        json={"holder": "other-host pid 1", "take": False},
        timeout=10,
        trust_env=False,
    ).json()
    return seen
