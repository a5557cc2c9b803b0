"""Small helpers the client's unit tests share (imported as ``client.unit_support``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import blake3
import pytest

from neffcache.client import remote as remote_module
from neffcache.client.stats import STATS


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def delta(before: dict[str, int], name: str) -> int:
    """How much the counter ``name`` rose since the snapshot ``before``."""
    return STATS.snapshot().get(name, 0) - before.get(name, 0)


def no_server_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off table is per process: a test starts with no server marked down."""
    monkeypatch.setattr(remote_module, "_down_until", {})


@contextlib.contextmanager
def closing_remotes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every Remote made inside closes its (this thread's) connection at the end."""
    from neffcache.client.remote import Remote

    made: list[Remote] = []
    init = Remote.__init__

    def tracked(self: Remote, config: Any) -> None:
        init(self, config)
        made.append(self)

    monkeypatch.setattr(Remote, "__init__", tracked)
    try:
        yield
    finally:
        for remote in made:
            remote.close()
