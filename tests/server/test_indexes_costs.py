"""What the entries role (index/entries.py, over catalogs.py) costs each persistent
backend, counted at the backend's door: a lookup (``get_entry``, ``resolve_alias``) is
one SQLite statement or one Redis command, and a publish with its aliases, or an added
alias, one SQLite transaction or one Redis command (its Lua script)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.backends import IndexHandles
from support.indexes import KEY, entry, persistent_store

from neffcache.server.index import Index, PutResult
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SqliteIndex

__all__ = ["persistent_store"]


@pytest.fixture
def counted(persistent_store: IndexHandles) -> Iterator[tuple[Index, list[str]]]:
    """A handle whose backend calls are recorded: SQLite's statements (the calling
    thread's connection) or the Redis commands sent. Every call was made once
    before, in another namespace: Redis loads a script the first time it runs."""
    index = persistent_store.open()
    index.put_entry(entry(namespace="warm"), ("w",))
    index.put_entry(entry(namespace="warm", manifest='{"other":1}'), ())
    index.add_alias("warm", "w2", KEY)
    seen: list[str] = []
    if isinstance(index, SqliteIndex):
        index.check()  # this thread's connection, opened before counting
        connection = index._connection()
        connection.set_trace_callback(seen.append)
        yield index, seen
        connection.set_trace_callback(None)
        return
    assert isinstance(index, RedisIndex)
    client: Any = index._redis
    sent: Callable[..., Any] = client.execute_command

    def counting(*args: Any, **options: Any) -> Any:
        seen.append(str(args[0]))
        return sent(*args, **options)

    client.execute_command = counting
    index.check()
    seen.clear()
    yield index, seen
    del client.execute_command


def transactions(seen: list[str]) -> int:
    """Write transactions among SQLite statements, or Redis commands (each atomic)."""
    begins = [s for s in seen if s.startswith("BEGIN")]
    return len(begins) if begins else len(seen)


def test_a_lookup_is_one_backend_read(counted: tuple[Index, list[str]]) -> None:
    index, seen = counted
    index.put_entry(entry(), ("addr",))
    seen.clear()
    assert index.get_entry("team-a", KEY) == entry()
    assert len(seen) == 1, seen
    seen.clear()
    assert index.get_entry("team-a", "ef" * 32) is None
    assert len(seen) == 1, seen
    seen.clear()
    assert index.resolve_alias("team-a", "addr") == KEY
    assert len(seen) == 1, seen


def test_a_publish_and_an_added_alias_are_one_write_each(
    counted: tuple[Index, list[str]],
) -> None:
    index, seen = counted
    assert index.put_entry(entry(), ("a", "b", "c")) is PutResult.CREATED
    assert transactions(seen) == 1, seen
    seen.clear()
    assert index.put_entry(entry(manifest='{"other":1}'), ("d",)) is PutResult.CONFLICT
    assert transactions(seen) == 1, seen
    seen.clear()
    assert index.add_alias("team-a", "e", KEY) is PutResult.CREATED
    assert transactions(seen) == 1, seen
