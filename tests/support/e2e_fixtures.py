"""Fixtures of the end-to-end suites that drive the client as processes (tests/client,
tests/shim_boundaries, tests/doctor), each imported by their conftest.py; the helpers
they build on are in tests/support/e2e.py.

* ``server``: one ``neffcache serve`` process shared by the session (anonymous, on a
  free loopback port); tests share it through their own ``namespace``.
* ``namespace``: a namespace name derived from the test's node id, unique per test.
* ``silent_server``: a loopback port that accepts connections and never answers.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest

from support.e2e import Server, SilentServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("shared-server") / "data")
    running.start()
    yield running
    running.kill()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^a-z0-9._-]+", "-", request.node.name.lower()).strip("-._")[:40]
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:10]
    return f"{base}-{digest}"


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    silent = SilentServer()
    yield silent
    silent.close()
