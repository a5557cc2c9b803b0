"""The Index contract's fixtures and records, shared by the index tests
(tests/server/test_indexes.py, test_index_eviction.py, and the per-role contracts in
tests/contract/): ``store`` is one index per
test of each kind, memory, sqlite and Redis (``persistent_store``: the kinds that
survive a reopen), on which ``open`` gives a new handle as a replica would; ``index``
is a handle on ``store``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.server.index import Entry, Failure, Index, Token
from support.backends import IndexHandles, backends

KEY = "ab" * 32
OTHER_KEY = "cd" * 32
# Generous: only there so a hung backend fails the test instead of the run.
HANG_LIMIT_S = 60.0


def entry(
    key: str = KEY,
    manifest: str = '{"neff":"11"}',
    *,
    namespace: str = "team-a",
    writer: str = "tok1",
    created_at: float = 1_712_000_000.125,
) -> Entry:
    return Entry(namespace, key, manifest, created_at, writer)


def failure(
    created_at: float,
    record: str | None = None,
    *,
    key: str = KEY,
    namespace: str = "team-a",
    ttl: float = 3600.0,
) -> Failure:
    record = record if record is not None else f'{{"at":{created_at!r}}}'
    return Failure(namespace, key, record, created_at, created_at + ttl)


# Earlier than every record: failures(..., now=BEFORE_ALL) shows all a backend stores.
BEFORE_ALL = 0.0


def token(
    token_id: str, created_at: float = 1_712_000_000.5, *, namespaces: tuple[str, ...] = ("*",)
) -> Token:
    return Token(
        token_id=token_id,
        secret_hash=f"hash-of-{token_id}",
        scope="write",
        namespaces=namespaces,
        name=f"ci job {token_id}",
        created_at=created_at,
    )


@pytest.fixture(params=backends("memory", "sqlite", "redis"))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexHandles]:
    handles = IndexHandles(request.param, request, tmp_path / "data")
    yield handles
    handles.close()


@pytest.fixture(params=backends("sqlite", "redis"))
def persistent_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexHandles]:
    handles = IndexHandles(request.param, request, tmp_path / "data")
    yield handles
    handles.close()


@pytest.fixture
def index(store: IndexHandles) -> Index:
    return store.open()
