"""What the whole suite shares: the services tests start (support/services.py), the
``--backend`` option and the shared ``stores`` and ``any_index`` fixtures
(support/backends.py), the ``e2e`` mark on the folders of end-to-end tests and on
every test that asks for a service (docs/development.md), and a line in the summary
when the Redis suites ran against fakeredis rather than a real ``redis-server``
(loopback.py says when)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import uses_fakeredis
from support import backends
from support.backends import any_index, documented_index, s3_client, stores
from support.daemons import stop_daemons
from support.services import redis_server, s3_bucket, s3_endpoint, unused_port

TESTS = Path(__file__).resolve().parent

# The shim starts a hit daemon (client/daemon.py) wherever it finds none, and it outlives
# the call. None starts unless a test asks for one (with a directory of its own:
# NEFFCACHE_DAEMON_DIR); and one that an environment built without NEFFCACHE_ variables
# starts anyway has its socket in this process's runtime directory, and is stopped when
# its test ends.
RUNTIME_DIR = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))  # short: a socket's name
os.environ["XDG_RUNTIME_DIR"] = str(RUNTIME_DIR)
os.environ["NEFFCACHE_DAEMON"] = "0"


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test() -> Iterator[None]:
    yield
    if any(RUNTIME_DIR.iterdir()):  # a listing: a /proc walk only when one may run
        stop_daemons(RUNTIME_DIR)
        for path in RUNTIME_DIR.iterdir():
            shutil.rmtree(path, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_daemons(RUNTIME_DIR)
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


__all__ = [
    "any_index",
    "documented_index",
    "redis_server",
    "s3_bucket",
    "s3_client",
    "s3_endpoint",
    "stores",
    "unused_port",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    backends.add_option(parser)


# Folders whose every test starts a process: a ``neffcache serve`` with short leases and
# hooks playing hosts (leases), two replicas over Redis and S3 (scaleout), the stand-in
# training and serving scripts (standins_test).
E2E_DIRS = ("leases", "scaleout", "standins_test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TESTS in item.path.parents and item.path.relative_to(TESTS).parts[0] in E2E_DIRS:
            item.add_marker(pytest.mark.e2e)
    backends.mark_service_users(items)
    backends.deselect_unchosen(config, items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if uses_fakeredis():
        terminalreporter.write_line(
            "note: the Redis suites ran against fakeredis (no redis-server on PATH, or "
            "NEFFCACHE_TEST_FAKEREDIS=1); "
            "install redis-server to run them against the real one, as CI does"
        )
