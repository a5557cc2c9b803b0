"""The recovery tests' fixture ``to_close``: the blob stores and indexes a test opens
and appends to it are closed after it (an unclosed store is a ResourceWarning, which
this suite treats as an error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def to_close() -> Iterator[list[Any]]:
    opened: list[Any] = []
    yield opened
    for store in reversed(opened):
        store.close()
