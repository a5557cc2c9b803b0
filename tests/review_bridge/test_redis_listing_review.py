"""Review of ``list_entries`` on Redis: the export pages through it, so an entry it
does not list is silently left out of every export."""

from __future__ import annotations

import redis

from neffcache.server.index import Entry, PutResult
from neffcache.server.index.redis import RedisIndex

KEY = "ab" * 32


def test_an_entry_written_before_the_upgrade_is_listed(redis_server: str) -> None:
    # A server older than the listing wrote the entry with the old script: no member
    # in neffcache:keys:{ns}. Simulated by writing it now and removing the member.
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    index = RedisIndex.from_url(redis_server)
    try:
        entry = Entry("team-a", KEY, '{"neff":"11"}', 1.5, "old-server")
        assert index.put_entry(entry, ()) is PutResult.CREATED
        client.delete("neffcache:keys:team-a")
        assert index.get_entry("team-a", KEY) is not None  # served, aliased, counted...
        # ...and publishing it again (a re-import: PutResult.SAME) does not repair it.
        assert index.put_entry(entry, ()) is PutResult.SAME
        assert [e.key for e in index.list_entries("team-a", None, 100)] == [KEY], (
            "an entry the server holds is missing from the listing, so from every export"
        )
    finally:
        index.close()
        client.close()
