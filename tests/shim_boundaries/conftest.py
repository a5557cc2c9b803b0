"""Fixtures for the tests of the compiler shim's boundaries: the shared ``server`` and
``namespace`` (tests/support/e2e_fixtures.py) and a ``sandbox`` per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.e2e import Sandbox
from support.e2e_fixtures import namespace, server

__all__ = ["namespace", "server"]


@pytest.fixture
def sandbox(tmp_path: Path, namespace: str) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "sandbox", namespace)
    box.root.mkdir()
    yield box
    box.kill_all()
