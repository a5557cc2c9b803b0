"""What the whole suite shares: a line in the summary when the Redis suites ran against
fakeredis rather than a real ``redis-server`` (loopback.py says when)."""

from __future__ import annotations

import pytest
from loopback import uses_fakeredis


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if uses_fakeredis():
        terminalreporter.write_line(
            "note: the Redis suites ran against fakeredis (no redis-server on PATH, or "
            "NEFFCACHE_TEST_FAKEREDIS=1); "
            "install redis-server to run them against the real one, as CI does"
        )
