"""Fixtures for the review's demonstration tests: the same real services as the
recovery tests (tests/recovery/conftest.py), and ``stores``: blob stores and
indexes a test opens, closed after it (an unclosed store is a ResourceWarning,
which this suite treats as an error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from server.conftest import redis_server, s3_bucket, s3_endpoint

__all__ = ["redis_server", "s3_bucket", "s3_endpoint", "stores"]


@pytest.fixture
def stores() -> Iterator[list[Any]]:
    opened: list[Any] = []
    yield opened
    for store in reversed(opened):
        store.close()
