"""The ``Records`` role (policies and pins) on every backend: create-only and
compare-and-set writes."""

from __future__ import annotations

from support.backends import IndexHandles
from support.indexes import index, store

from neffcache.server.index import Record, Records

__all__ = ["index", "store"]


def test_create_only_and_replacing_never_merge_two_writers(index: Records) -> None:
    first = Record("policy", "team-a", "", '{"ttl":1}')
    assert index.put_record(first, create_only=True)
    assert not index.put_record(Record("policy", "team-a", "", '{"ttl":2}'), create_only=True)
    second = Record("policy", "team-a", "", '{"ttl":3}')
    assert not index.put_record(second, replacing='{"ttl":2}')
    assert index.put_record(second, replacing='{"ttl":1}')
    assert index.get_record("policy", "team-a", "") == second


def test_records_list_by_kind_and_namespace_and_delete(index: Records) -> None:
    for ns, name in (("b", "x"), ("a", "y"), ("a", "x")):
        index.put_record(Record("pin", ns, name, "{}"))
    assert [(r.namespace, r.name) for r in index.records("pin")] == [
        ("a", "x"),
        ("a", "y"),
        ("b", "x"),
    ]
    assert [r.name for r in index.records("pin", "a")] == ["x", "y"]
    assert index.delete_record("pin", "a", "x")
    assert not index.delete_record("pin", "a", "x")
    assert index.records("policy") == []


def test_a_plain_put_replaces_what_any_replica_stored(store: IndexHandles) -> None:
    first, second = store.open(), store.open()
    assert first.put_record(Record("mark", "", "d1", "1.0"))
    assert second.put_record(Record("mark", "", "d1", "2.0"))
    assert second.put_record(Record("mark", "", "d1", "2.0"))  # the same again
    assert first.get_record("mark", "", "d1") == Record("mark", "", "d1", "2.0")
    assert first.delete_record("mark", "", "d1")
    assert second.get_record("mark", "", "d1") is None


def test_names_with_separators_stay_apart(index: Records) -> None:
    index.put_record(Record("pin", "a:b", "c", "1"))
    index.put_record(Record("pin", "a", "b:c", "2"))
    assert index.get_record("pin", "a:b", "c") == Record("pin", "a:b", "c", "1")
    assert [r.value for r in index.records("pin", "a")] == ["2"]
