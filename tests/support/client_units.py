"""Small helpers the client's unit tests share: digests, counter deltas, an injected
clock, Remotes closed after a test, the variables a wrapper test clears, and
``FakeStock``, the parts of the SDK's CompileCacheFs that the hook's Core uses."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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


# What a test of the wrapper in this process unsets first: the outer environment's
# cache, stock-cache and compiler settings would otherwise decide what it does.
CLEARED_ENV = (
    "NEFFCACHE_URL",
    "NEURON_CC_FLAGS",
    "NEURON_COMPILE_CACHE_URL",
    "NEFFCACHE_IN_WRAPPER",
    "NEFFCACHE_DISABLE",
    "NEFFCACHE_REAL_COMPILER",
    "NEFFCACHE_RUN_MANIFEST",
    "NEFFCACHE_TOKEN",
    "NEFFCACHE_STOCK_FAILURES",
    "XLA_FLAGS",
)

# The stand-in compiler's version, and a stock address under it.
VERSION = "2.20.9961.0+0acef03a"
ADDRESS = f"neuronxcc-{VERSION}/MODULE_123+abcdef01"


class FakeStock:
    """The parts of the SDK's CompileCacheFs that Core uses; it records, for each
    ``upload_string_to_file``, which entry files were already in place."""

    def __init__(self, root: Path) -> None:
        self.cache_path = str(root)
        self.uploads: list[tuple[str, list[str]]] = []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def upload_string_to_file(self, path: str, data: str) -> None:
        directory = os.path.dirname(path)
        self.uploads.append((os.path.basename(path), sorted(os.listdir(directory))))
        Path(path).write_text(data)


@dataclass
class TokenServer:
    """tests/client/conftest.py's ``token_server``: its URL, tokens by role, and every
    request it answered."""

    url: str
    tokens: dict[str, str]  # "read": reads team-a; "other": reads team-b; "unknown"
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
