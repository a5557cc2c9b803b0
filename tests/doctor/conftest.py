"""Fixtures for ``neffcache doctor``'s tests; the helpers are in doctor_harness.py.

* ``server``, ``silent_server``: tests/support/e2e_fixtures.py's (the shared anonymous
  ``neffcache serve``, a port that never answers); ``unused_port`` is the suite's.
* ``token_server``: a ``neffcache serve`` that requires tokens, with an admin, a
  write and a read token for namespace ``team-a`` (the same harness ``Server``).
* ``status_server``: a stand-in for the server's ``/v1/status`` whose answer a test
  sets (its clock skewed, a namespace's policy), on a loopback port.
* ``other_python``: a virtual environment's Python, without neffcache (another
  environment on the same host, as images with several have).
* ``sockets``: a hit daemon's socket directory (``NEFFCACHE_DAEMON_DIR``), mode 0700
  and short enough for a Unix socket's name; the daemons under it are killed at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor.doctor_harness import StatusServer, TokenServer
from support.daemons import socket_directory
from support.e2e import NEFFCACHE, Server, clean_environ
from support.e2e_fixtures import server, silent_server

__all__ = ["server", "silent_server"]


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    data = tmp_path_factory.mktemp("token-server") / "data"

    def token(*args: str) -> str:
        done = subprocess.run(
            [*NEFFCACHE, "admin", "token", "create", *args, "--json"],
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        secret: str = json.loads(done.stdout)["token"]
        return secret

    admin = token("--local", "--data-dir", str(data), "--scope", "admin", "--namespace", "*")
    running = Server(data)
    running.start()
    try:
        remote = ("--server", running.url, "--token", admin, "--namespace", "team-a")
        writer = token(*remote, "--scope", "write", "--name", "ci-writer")
        reader = token(*remote, "--scope", "read", "--name", "fleet-reader")
        yield TokenServer(running, admin, writer, reader)
    finally:
        running.kill()


@pytest.fixture
def status_server() -> Iterator[StatusServer]:
    fake = StatusServer()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def other_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("other-env") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)],
        env=clean_environ(),
        check=True,
        timeout=120,
        capture_output=True,
    )
    return where / "bin" / "python"


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A hit daemon's socket directory of the test's own (support/daemons.py)."""
    with socket_directory() as directory:
        yield directory
