"""Tokens, records and the audit log stored by earlier servers, read by this one: a
SQLite file of schema 7 (tokens and records in their own tables) and a Redis database
with tokens in the three keys of before and the audit log in its sorted set of before.
After the move, a server of before fails closed on them."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
import redis
from support.indexes import token

from neffcache.server.index import AuditRecord, Record, Token, redis_upgrade, sqlite_schema
from neffcache.server.index import sqlite as sqlite_index
from neffcache.server.index.redis import RedisIndex
from neffcache.server.index.sqlite import SqliteIndex

REVOKED = dataclasses.replace(token("t1"), revoked=True, trusted=True)
LIVE = dataclasses.replace(token("t2", 1_712_000_001.25), namespaces=("team-a", "team-b"))
PIN = Record("pin", "team-a", "resnet", '{"until":null}')
POLICY = Record("policy", "a:b", "", '{"ttl":1}')


def _v7_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file as a server of schema 7 left it: made by this code's steps up to 7 (steps
    never change once shipped), its rows written as that server's SQL wrote them."""
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_schema, "SCHEMA_VERSION", 7)
        patch.setattr(sqlite_index, "SCHEMA_VERSION", 7)
        SqliteIndex.from_url(f"sqlite://{path}").close()
    with sqlite3.connect(path) as conn:
        for t in (REVOKED, LIVE):
            conn.execute(
                "INSERT INTO tokens (token_id, secret_hash, scope, namespaces, name,"
                " created_at, revoked, trusted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    t.token_id,
                    t.secret_hash,
                    t.scope,
                    json.dumps(list(t.namespaces)),
                    t.name,
                    t.created_at,
                    int(t.revoked),
                    int(t.trusted),
                ),
            )
        for r in (PIN, POLICY):
            conn.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?)", (r.kind, r.namespace, r.name, r.value)
            )
        assert conn.execute("PRAGMA user_version").fetchone() == (7,)


def test_sqlite_schema_7_tokens_and_records_move_to_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "index.db"
    _v7_file(path, monkeypatch)
    index = SqliteIndex.from_url(f"sqlite://{path}")
    assert index.tokens() == [REVOKED, LIVE]
    assert index.token_by_hash(LIVE.secret_hash) == LIVE
    assert index.records("pin") == [PIN]
    assert index.get_record("policy", "a:b", "") == POLICY
    assert index.revoke_token(LIVE.token_id)
    index.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (sqlite_schema.SCHEMA_VERSION,)
        # A schema 7 server still open on the file fails closed: its tables are gone.
        for old in ("SELECT * FROM tokens", "SELECT * FROM records"):
            with pytest.raises(sqlite3.OperationalError, match="no such table"):
                conn.execute(old)
    again = SqliteIndex.from_url(f"sqlite://{path}")  # no step runs twice
    assert [t.revoked for t in again.tokens()] == [True, True]
    again.close()


def _store_as_before(client: redis.Redis, t: Token) -> None:
    fields = {"secret_hash": t.secret_hash, "scope": t.scope, "name": t.name}
    fields |= {"namespaces": json.dumps(list(t.namespaces))}
    fields |= {"created_at": repr(t.created_at), "revoked": "1" if t.revoked else "0"}
    fields |= {"trusted": "1" if t.trusted else "0"}
    client.hset(f"neffcache:token:{t.token_id}", mapping=fields)
    client.set(f"neffcache:token-hash:{t.secret_hash}", t.token_id)
    client.zadd("neffcache:tokens", {t.token_id: t.created_at})


def test_redis_tokens_of_before_move_to_their_map_and_old_servers_fail_closed(
    redis_server: str,
) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    for t in (REVOKED, LIVE):
        _store_as_before(client, t)
    # Records kept their layout: one hash per kind, fields JSON [namespace, name].
    client.hset("neffcache:records:pin", '["team-a", "resnet"]', PIN.value)
    first, second = RedisIndex.from_url(redis_server), RedisIndex.from_url(redis_server)
    assert first.token_by_hash(LIVE.secret_hash) == LIVE
    assert second.tokens() == [REVOKED, LIVE]  # the move ran once, by the first
    assert first.records("pin") == [PIN]
    assert set(client.keys("neffcache:token*")) == {"neffcache:tokens", "neffcache:token-records"}
    # What a server of before asks first: a string where it wants a sorted set.
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        client.zrange("neffcache:tokens", 0, -1)
    assert client.get(f"neffcache:token-hash:{LIVE.secret_hash}") is None
    for each in (first, second):
        each.close()
    client.close()


def test_a_token_an_earlier_server_writes_during_the_move_is_moved_too(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    _store_as_before(client, REVOKED)
    read_old = redis_upgrade._old_token
    calls = 0

    def read_then_write_another(token_id: str, fields: object) -> Token | None:
        nonlocal calls
        calls += 1
        if calls == 1:  # between the move's reads and its MULTI/EXEC
            _store_as_before(client, LIVE)
        return read_old(token_id, fields)

    monkeypatch.setattr(redis_upgrade, "_old_token", read_then_write_another)
    index = RedisIndex.from_url(redis_server)
    assert index.tokens() == [REVOKED, LIVE]
    assert calls == 3  # one token read, then both again after the watch tripped
    index.close()
    client.close()


OLD_AUDIT = [
    AuditRecord(2.5, "tok1 ci", "pin", "team-a", "resnet", '{"until":null}'),
    AuditRecord(2.5, "evictor@host", "evict", "a:b", "ab" * 32, '{"why":"größe"}'),
    AuditRecord(3.0, "tok2 admin", "namespace.create", "", "team-c", "{}"),
]


def _append_audit_as_before(client: redis.Redis, records: list[AuditRecord]) -> None:
    """As a server of before appended: members "<seq> <record JSON>" scored by time."""
    for r in records:
        seq = client.incr("neffcache:audit-seq")
        fields = dataclasses.asdict(r)
        client.zadd("neffcache:audit", {f"{seq:020d} {json.dumps(fields)}": r.at})


def test_redis_audit_of_before_moves_to_its_sequence_and_old_servers_fail_closed(
    redis_server: str,
) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    _append_audit_as_before(client, OLD_AUDIT)
    first, second = RedisIndex.from_url(redis_server), RedisIndex.from_url(redis_server)
    newest_first = OLD_AUDIT[::-1]  # of one instant, the later appended first
    assert first.audit(0.0, None, 10) == newest_first
    assert second.audit(0.0, "a:b", 10) == [OLD_AUDIT[1]]  # the move ran once, by the first
    # The sequence goes on: a record of the same instant comes before those moved.
    later = AuditRecord(3.0, "tok2 admin", "unpin", "team-a", "resnet", "{}")
    second.append_audit([later], keep=3)
    assert first.audit(0.0, None, 10) == [later, *newest_first[:2]]
    assert client.get("neffcache:audit") == "moved to neffcache:audit-log"
    assert client.exists("neffcache:audit-seq") == 0
    # What a server of before runs on every read and append: a string, not a sorted set.
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        client.zrevrangebyscore("neffcache:audit", "+inf", "-inf")
    for each in (first, second):
        each.close()
    client.close()


def test_an_audit_record_an_earlier_server_appends_during_the_move_is_moved_too(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.flushdb()
    _append_audit_as_before(client, OLD_AUDIT[:1])
    read_old = redis_upgrade._old_record
    calls = 0

    def read_then_append_another(raw: str) -> AuditRecord:
        nonlocal calls
        calls += 1
        if calls == 1:  # between the move's reads and its MULTI/EXEC
            _append_audit_as_before(client, OLD_AUDIT[1:2])
        return read_old(raw)

    monkeypatch.setattr(redis_upgrade, "_old_record", read_then_append_another)
    index = RedisIndex.from_url(redis_server)
    assert index.audit(0.0, None, 10) == OLD_AUDIT[1::-1]
    assert calls == 3  # one record read, then both again after the watch tripped
    index.close()
    client.close()
