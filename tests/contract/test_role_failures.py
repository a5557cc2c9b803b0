"""The ``Failures`` role (index/failures.py, written once over logs) on every backend:
bounded, newest first, expiring, kept apart per key."""

from __future__ import annotations

from support.indexes import BEFORE_ALL, KEY, OTHER_KEY, failure, index, store

from neffcache.server.index import Failures

__all__ = ["index", "store"]


def test_records_come_newest_first_and_only_keep_are_kept(index: Failures) -> None:
    for at in (101.0, 100.0, 102.0):
        index.put_failure(failure(at), keep=2)
    found = index.failures("team-a", KEY, BEFORE_ALL)
    assert found == [failure(102.0), failure(101.0)]


def test_expired_records_are_not_read(index: Failures) -> None:
    index.put_failure(failure(100.0, ttl=10.0), keep=5)
    assert index.failures("team-a", KEY, 110.0) == []
    assert index.failures("team-a", OTHER_KEY, BEFORE_ALL) == []
    assert index.failures("other", KEY, BEFORE_ALL) == []


def test_two_identical_records_of_one_instant_are_both_kept(index: Failures) -> None:
    index.put_failure(failure(100.0, '{"same":1}'), keep=5)
    index.put_failure(failure(100.0, '{"same":1}'), keep=5)
    assert index.failures("team-a", KEY, BEFORE_ALL) == [failure(100.0, '{"same":1}')] * 2
