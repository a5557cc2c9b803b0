"""Fixtures for the bridge's tests: real neffcache servers on loopback ports (uvicorn in
a thread, so a test can hand the app faulty stores), moto's S3 server from the server
tests, and the ``neffcache`` command run in this process.

* ``server``: one server with in-memory stores, shared by the session; tests keep
  apart through their own ``namespace``.
* ``start_server``: a private server over the stores (and settings) a test passes.
* ``neffcache``: runs the CLI's ``main`` and returns (exit code, stdout, stderr).

Nothing the outer environment sets (``NEFFCACHE_*``, proxies) reaches a test.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import InThread
from support.bridge_server import Run, Server, StartServer

from neffcache.server.app import create_app
from neffcache.server.blobs import BlobStore
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index import Index
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """``start_server(blobs=None, index=None, **settings)``: a private server."""
    running: list[InThread] = []
    stores: list[BlobStore | Index] = []

    def start(
        blobs: BlobStore | None = None, index: Index | None = None, **settings: Any
    ) -> Server:
        blobs = blobs or MemoryBlobStore()
        index = index or MemoryIndex()
        data_dir = tmp_path / f"server-{len(running)}"
        app = create_app(
            ServerSettings(data_dir=data_dir, **settings), blob_store=blobs, index=index
        )
        running.append(InThread(app))
        stores.extend((blobs, index))
        return Server(running[-1].__enter__(), blobs, index)

    yield start
    for one in running:
        one.__exit__()
    for store in stores:
        store.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    blobs, index = MemoryBlobStore(), MemoryIndex()
    settings = ServerSettings(data_dir=tmp_path_factory.mktemp("bridge-server"))
    with InThread(create_app(settings, blob_store=blobs, index=index)) as url:
        yield Server(url, blobs, index)
    blobs.close()
    index.close()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9._-]+", "-", request.node.name.lower()).strip("-._")[:40]
    return f"{base}-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:10]}"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NEFFCACHE_URL", "NEFFCACHE_TOKEN", "NEFFCACHE_SERVER"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def neffcache(capsys: pytest.CaptureFixture[str]) -> Run:
    """``neffcache(*argv)`` -> (exit code, stdout, stderr), in this process."""
    from neffcache.client.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
