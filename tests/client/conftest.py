"""Fixtures for the client's end-to-end tests (test_e2e_*.py); the helpers they build
on are in support/e2e.py.

* ``server``: one ``neffcache serve`` process shared by the session (anonymous, on a
  free loopback port). Tests share it through their own ``namespace``; a test that
  damages or stops its server asks for ``private_server`` instead.
* ``namespace``: a namespace name derived from the test's node id, unique per test.
* ``sandbox``: per-test directories, the stand-in compiler's invocation counter, child
  environments and process launchers; every child still running at teardown is killed.
* ``silent_server``: a loopback port that accepts connections and never answers.
* ``unused_port``: a loopback port nothing listens on.
* ``token_server``: a server that takes tokens, in a thread of the test process (a
  token made on ``server`` would end its anonymous access for every other test), with
  a read token for ``team-a``, one for ``team-b`` only, and every request it answered.
* ``sockets``: a hit daemon's socket directory of the test's own; its daemons are
  stopped at the end (support/daemons.py).

``server``, ``namespace`` and ``silent_server`` are tests/support/e2e_fixtures.py's;
``unused_port`` is the whole suite's (tests/support/services.py).

Nothing here is autouse but the reset of shared leases: test_cli_key.py shares this
directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.client_units import TokenServer
from support.daemons import socket_directory
from support.e2e import Sandbox, Server
from support.e2e_fixtures import namespace, server, silent_server
from support.lease_hosts import TTL

__all__ = ["namespace", "server", "silent_server"]


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    import httpx
    from loopback import InThread

    from neffcache.server.app import create_app
    from neffcache.server.blobs.memory import MemoryBlobStore
    from neffcache.server.index.memory import MemoryIndex
    from neffcache.server.settings import ServerSettings

    data = tmp_path_factory.mktemp("token-server")
    settings = ServerSettings(data_dir=data, eviction_interval_seconds=0)
    blobs = MemoryBlobStore()
    app = create_app(settings, blob_store=blobs, index=MemoryIndex())
    seen: list[tuple[str, str]] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append((scope["method"], scope["path"]))
        await app(scope, receive, send)

    with InThread(counting) as url:

        def token(scope: str, namespace: str, admin: str | None = None) -> str:
            headers = {"Authorization": f"Bearer {admin}"} if admin else {}
            body = {"scope": scope, "namespaces": [namespace]}
            answer = httpx.post(
                f"{url}/v1/admin/tokens", json=body, headers=headers, trust_env=False
            )
            made: str = answer.raise_for_status().json()["token"]
            return made

        admin = token("admin", "*")  # anonymous: the server has no token yet
        tokens = {
            "read": token("read", "team-a", admin),
            "other": token("read", "team-b", admin),
            "unknown": "nfc_000000000000_unknown",
        }
        seen.clear()
        yield TokenServer(url, tokens, seen)
    blobs.close()


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "server-data")
    running.start()
    yield running
    running.kill()


@pytest.fixture
def sandbox(tmp_path: Path, namespace: str) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "sandbox", namespace)
    box.root.mkdir()
    yield box
    box.kill_all()
    # Whatever the flow, the SDK must never have made a stock cache named after a
    # neffcache+ URL (a URL that reached a stock cache constructor).
    junk = [str(p) for p in box.root.rglob("*neffcache+*")]
    assert junk == [], f"directories named after a neffcache+ URL: {junk}"


@pytest.fixture
def short_ttl_server(tmp_path: Path) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a ``neffcache serve`` whose leases live
    ``TTL`` seconds (tests/herd.py's server)."""
    from herd import lease_server

    root = tmp_path / "short-ttl-server"
    root.mkdir()
    server = lease_server(root, TTL)
    yield server.url
    server.kill()


@pytest.fixture(autouse=True)
def _no_shared_leases() -> Iterator[None]:
    """Leases are shared per process (lease.shared_leases): none outlives its test."""
    yield
    from neffcache.client.lease import reset_shared_leases

    reset_shared_leases()


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A hit daemon's socket directory of the test's own (support/daemons.py)."""
    with socket_directory() as directory:
        yield directory
