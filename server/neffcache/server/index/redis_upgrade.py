"""Tokens stored by servers before tokens were written once over maps (tokens.py),
moved into the map, once, by the first server that reads tokens.

Earlier servers kept a token as three keys: ``neffcache:token:{token_id}`` (a hash of
its fields), ``neffcache:token-hash:{secret_hash}`` (its id) and the sorted set
``neffcache:tokens`` (every id, by age). The move copies each into the map
``neffcache:token-records``, deletes them, and leaves ``neffcache:tokens`` a string
saying where tokens went, in one MULTI/EXEC watched on every key it read: an earlier
server writing a token meanwhile makes it start again. After it, an earlier server
still running fails closed: listing tokens meets a string where it expects a sorted
set (an error, 503), and a token's hash names no token (401).
"""

from __future__ import annotations

import json

import redis

from .base import Token
from .redis_primitives import PREFIX, as_str
from .tokens import TOKENS, token_value

OLD_TOKENS = PREFIX + "tokens"
MOVED = f"moved to {PREFIX}{TOKENS}"


def move_old_tokens(client: redis.Redis) -> int:
    """Move every token of the earlier layout into the map; the number moved.
    Idempotent: once ``neffcache:tokens`` says where tokens went, one read."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                return _move(pipe)
            except redis.WatchError:
                continue  # an earlier server wrote a token meanwhile: read again


def _move(pipe: redis.client.Pipeline) -> int:
    pipe.watch(OLD_TOKENS)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    kind = as_str(pipe.type(OLD_TOKENS))
    if kind == "string":
        pipe.unwatch()
        return 0
    token_ids = [as_str(t) for t in pipe.zrange(OLD_TOKENS, 0, -1)] if kind == "zset" else []
    if token_ids:
        pipe.watch(*[PREFIX + f"token:{token_id}" for token_id in token_ids])  # type: ignore[no-untyped-call]
    tokens = [
        _old_token(token_id, pipe.hgetall(PREFIX + f"token:{token_id}")) for token_id in token_ids
    ]
    pipe.multi()
    for token in tokens:
        if token is None:
            continue
        pipe.hsetnx(PREFIX + TOKENS, token.secret_hash, token_value(token))
        pipe.delete(PREFIX + f"token:{token.token_id}", PREFIX + f"token-hash:{token.secret_hash}")
    pipe.set(OLD_TOKENS, MOVED)
    pipe.execute()
    return sum(token is not None for token in tokens)


def _old_token(token_id: str, fields: object) -> Token | None:
    """A token as an earlier server stored it; None for an id whose hash is gone."""
    assert isinstance(fields, dict), type(fields)
    if not fields:
        return None
    return Token(
        token_id=token_id,
        secret_hash=fields["secret_hash"],
        scope=fields["scope"],
        namespaces=tuple(json.loads(fields["namespaces"])),
        name=fields["name"],
        created_at=float(fields["created_at"]),
        revoked=fields["revoked"] == "1",
        # Absent from tokens stored before trust existed: they are not trusted.
        trusted=fields.get("trusted") == "1",
    )
