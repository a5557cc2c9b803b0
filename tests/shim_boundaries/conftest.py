"""Fixtures for the tests of the compiler shim's boundaries: the same ``server`` and
``sandbox`` as tests/client/conftest.py, which does not reach this folder."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from client.e2e_harness import Sandbox, Server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("shim-boundaries-server") / "data")
    running.start()
    yield running
    running.kill()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9._-]+", "-", request.node.name.lower()).strip("-._")[:40]
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:10]
    return f"{base}-{digest}"


@pytest.fixture
def sandbox(tmp_path: Path, namespace: str) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "sandbox", namespace)
    box.root.mkdir()
    yield box
    box.kill_all()
