"""Small helpers the client's unit tests share (imported as ``client.unit_support``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from neffcache.client import remote as remote_module
from neffcache.client.config import ClientConfig
from neffcache.client.remote import Remote
from neffcache.client.stats import STATS


def digest(data: bytes) -> str:
    value: str = blake3.blake3(data).hexdigest()
    return value


def delta(before: dict[str, int], name: str) -> int:
    """How much the counter ``name`` rose since the snapshot ``before``."""
    return STATS.snapshot().get(name, 0) - before.get(name, 0)


class Clock:
    """``time`` as one client module sees it (``install``): its monotonic time moves
    only when that module sleeps, so how long a bounded wait lasted is exact on any
    machine, however loaded. Everything else is the real ``time``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def install(self, monkeypatch: pytest.MonkeyPatch, module: object) -> Clock:
        monkeypatch.setattr(module, "time", self)
        return self


def no_server_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off table is per process: a test starts with no server marked down, no
    refusal known and none said (as a new process would)."""
    monkeypatch.setattr(remote_module, "_down_until", {})
    monkeypatch.setattr(remote_module, "_refusals", {})
    monkeypatch.setattr(remote_module, "_said", set())


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


@contextlib.contextmanager
def open_remote(url: str, local_dir: Path, timeout: float = 10.0) -> Iterator[Remote]:
    """A real ``Remote`` for namespace ``team-a`` of the server at ``url``, as a
    training job's environment would configure it; closed on exit."""
    config = ClientConfig.from_env(
        {
            "NEFFCACHE_URL": f"neffcache+{url}/team-a",
            "NEFFCACHE_LOCAL_DIR": str(local_dir),
            "NEFFCACHE_TIMEOUT": str(timeout),
            "NEFFCACHE_CONNECT_TIMEOUT": "1",
        }
    )
    assert config is not None
    remote = Remote(config)
    try:
        yield remote
    finally:
        remote.close()
