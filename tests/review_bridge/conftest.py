"""Fixtures for the review's tests: the bridge's own (servers on loopback ports, the
CLI in this process) plus a few helpers. Nothing here changes the code under test."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from bridge.conftest import (  # noqa: F401  (fixtures, re-registered here)
    Run,
    Server,
    StartServer,
    _clean_environment,
    _Running,
    namespace,
    neffcache,
    server,
    start_server,
)
from server.conftest import redis_server, s3_bucket, s3_endpoint, unused_port  # noqa: F401

from neffcache.server.app import create_app
from neffcache.server.blobs.memory import MemoryBlobStore
from neffcache.server.index.memory import MemoryIndex
from neffcache.server.settings import ServerSettings


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def publish(url: str, namespace: str, manifest: dict[str, Any], blobs: dict[str, bytes]) -> None:
    """Upload ``blobs`` (name -> bytes) and a manifest naming them, by hand."""
    files = {}
    for name, data in blobs.items():
        put = httpx.put(f"{url}/v1/blobs/{digest(data)}", content=data, trust_env=False)
        assert put.status_code in (200, 201), put.text
        files[name] = {"digest": digest(data), "size": len(data)}
    manifest = {**manifest, "files": files}
    put = httpx.put(
        f"{url}/v1/ns/{namespace}/entries/{manifest['key']}",
        content=json.dumps(manifest),
        trust_env=False,
    )
    assert put.status_code in (200, 201), put.text


Middleware = Callable[[Any], Any]


@pytest.fixture
def wrapped_server(tmp_path: Path) -> Iterator[Callable[[Middleware], str]]:
    """``wrapped_server(wrap)``: a server whose ASGI app is ``wrap(app)``; its URL."""
    running: list[_Running] = []

    def start(wrap: Middleware) -> str:
        app = create_app(
            ServerSettings(data_dir=tmp_path / f"srv-{len(running)}"),
            blob_store=MemoryBlobStore(),
            index=MemoryIndex(),
        )
        running.append(_Running(wrap(app)))
        url: str = running[-1].__enter__()
        return url

    yield start
    for one in running:
        one.__exit__()


@pytest.fixture
def client_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean client environment with L1 in tmp_path/l1 and no server marked down."""
    from neffcache.client import remote as remote_module

    for name in list(os.environ):
        if name.startswith(("NEFFCACHE_", "NEURON_", "XLA_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(remote_module, "_down_until", {})
    l1 = tmp_path / "l1"
    monkeypatch.setenv("NEFFCACHE_LOCAL_DIR", str(l1))
    return l1
