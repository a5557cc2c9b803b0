"""What servers stored before the roles were written once over the primitives, moved
once by the first server that uses the role: tokens into their map (tokens.py), and
the audit log into its sequence (audit.py).

Earlier servers kept a token as three keys: ``neffcache:token:{token_id}`` (a hash of
its fields), ``neffcache:token-hash:{secret_hash}`` (its id) and the sorted set
``neffcache:tokens`` (every id, by age). The move copies each into the map
``neffcache:token-records``, deletes them, and leaves ``neffcache:tokens`` a string
saying where tokens went, in one MULTI/EXEC watched on every key it read: an earlier
server writing a token meanwhile makes it start again. After it, an earlier server
still running fails closed: listing tokens meets a string where it expects a sorted
set (an error, 503), and a token's hash names no token (401).

Earlier servers kept the audit log in the sorted set ``neffcache:audit``, each member
"<seq> <record JSON>", its sequence in ``neffcache:audit-seq``. The move writes each
record, with its sequence and score, as an item of the sequence ``audit-log``
(``neffcache:audit-log``), carries the sequence on, and leaves ``neffcache:audit`` a
string saying where the log went, in one MULTI/EXEC watched on what it read. An
earlier server still running then fails its audit reads and appends (a string where
it expects a sorted set) rather than writing records no new server reads.
"""

from __future__ import annotations

import json

import redis

from .audit import AUDIT_LOG, audit_item
from .base import AuditRecord, Token
from .redis_primitives import PREFIX, as_str
from .redis_sequences import item_text
from .tokens import TOKENS, token_value

OLD_TOKENS = PREFIX + "tokens"
MOVED = f"moved to {PREFIX}{TOKENS}"
OLD_AUDIT = PREFIX + "audit"
OLD_AUDIT_SEQ = PREFIX + "audit-seq"
AUDIT_MOVED = f"moved to {PREFIX}{AUDIT_LOG}"


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


def move_old_audit(client: redis.Redis) -> int:
    """Move every audit record of the earlier layout into the sequence; the number
    moved. Idempotent: once ``neffcache:audit`` says where the log went, one read."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                return _move_audit(pipe)
            except redis.WatchError:
                continue  # an earlier server appended meanwhile: read again


def _move_audit(pipe: redis.client.Pipeline) -> int:
    log, seq_key = PREFIX + AUDIT_LOG, f"{PREFIX}{AUDIT_LOG}-seq"
    pipe.watch(OLD_AUDIT, OLD_AUDIT_SEQ, seq_key)  # type: ignore[no-untyped-call]
    kind = as_str(pipe.type(OLD_AUDIT))
    if kind == "string":
        pipe.unwatch()
        return 0
    rows = pipe.zrange(OLD_AUDIT, 0, -1, withscores=True) if kind == "zset" else []
    assert isinstance(rows, list), type(rows)
    moved: dict[str, float] = {}
    for pair in rows:
        assert isinstance(pair, tuple), type(pair)  # withscores: (member, score)
        member, score = pair
        seq, raw = as_str(member).split(" ", 1)
        moved[f"{seq} {item_text(audit_item(_old_record(raw)))}"] = float(score)
    # The sequence goes on past every record moved (and any the new log handed out).
    last = max(int(as_str(pipe.get(key) or "0")) for key in (OLD_AUDIT_SEQ, seq_key))
    pipe.multi()
    if moved:
        pipe.zadd(log, moved)
    if last:
        pipe.set(seq_key, last)
    pipe.delete(OLD_AUDIT_SEQ)
    pipe.set(OLD_AUDIT, AUDIT_MOVED)
    pipe.execute()
    return len(moved)


def _old_record(raw: str) -> AuditRecord:
    """An audit record as an earlier server stored it: JSON of every field."""
    fields = json.loads(raw)
    return AuditRecord(
        at=fields["at"],
        actor=fields["actor"],
        action=fields["action"],
        namespace=fields["namespace"],
        target=fields["target"],
        detail=fields["detail"],
    )
