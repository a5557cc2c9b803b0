"""Fixtures for the recovery regression tests: the suite's real services
(tests/support/services.py), and ``stores``: blob stores and indexes a test opens,
closed after it (an unclosed store is a ResourceWarning,
which this suite treats as an error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["stores"]


@pytest.fixture
def stores() -> Iterator[list[Any]]:
    opened: list[Any] = []
    yield opened
    for store in reversed(opened):
        store.close()
