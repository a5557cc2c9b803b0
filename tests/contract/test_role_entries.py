"""The ``Entries`` role on every backend: immutable entries, their aliases, and the
facts and use eviction reads."""

from __future__ import annotations

from support.indexes import KEY, OTHER_KEY, entry, index, store

from neffcache.server.index import Entries, PutResult, Touch

__all__ = ["index", "store"]


def test_an_entry_is_created_once_and_never_rewritten(index: Entries) -> None:
    first = entry(manifest='{"neff":"1"}')
    assert index.put_entry(first, ("addr",)) is PutResult.CREATED
    assert index.put_entry(entry(manifest='{"neff":"1"}', writer="t2"), ()) is PutResult.SAME
    assert index.put_entry(entry(manifest='{"neff":"2"}'), ()) is PutResult.CONFLICT
    assert index.get_entry("team-a", KEY) == first
    assert index.resolve_alias("team-a", "addr") == KEY
    assert index.aliases_of("team-a", KEY) == ["addr"]


def test_an_alias_keeps_its_live_entry_and_frees_with_its_deletion(index: Entries) -> None:
    index.put_entry(entry(KEY, created_at=1.0), ("addr",))
    index.put_entry(entry(OTHER_KEY), ())
    assert index.add_alias("team-a", "addr", OTHER_KEY) is PutResult.CONFLICT
    assert index.add_alias("team-a", "addr", "ef" * 32) is None
    assert not index.delete_entry("team-a", KEY, 2.0)
    assert index.delete_entry("team-a", KEY, 1.0)
    assert index.resolve_alias("team-a", "addr") is None
    assert index.add_alias("team-a", "addr", OTHER_KEY) is PutResult.CREATED


def test_touches_count_and_listing_pages_by_key(index: Entries) -> None:
    index.put_entry(entry(KEY, created_at=10.0), ())
    index.put_entry(entry(OTHER_KEY, created_at=10.0), ())
    index.touch_entries([Touch("team-a", KEY, 20.0, 3), Touch("team-a", "ef" * 32, 30.0, 1)])
    (first,) = index.entry_stats("team-a", None, 1)
    assert (first.key, first.last_access, first.hits) == (KEY, 20.0, 3)
    assert [e.key for e in index.list_entries("team-a", KEY, 10)] == [OTHER_KEY]
    assert index.namespaces() == ["team-a"]
