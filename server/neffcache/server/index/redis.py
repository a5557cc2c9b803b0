"""A Redis index, ``redis://host:port/db``: shared by every server replica.

Every key starts with ``neffcache:``::

    neffcache:entry:{ns}:{key}          JSON {"manifest", "created_at", "writer"}
    neffcache:alias:{ns}:{alias}        the key the alias names
    neffcache:keys:{ns}                 sorted set of the namespace's entry keys, every
                                        score 0, so ZRANGEBYLEX lists them in key order
    neffcache:token:{token_id}          a hash of the Token's fields
    neffcache:token-hash:{secret_hash}  token_id
    neffcache:tokens                    sorted set of token_ids, scored by created_at
    neffcache:failures:{ns}:{key}       sorted set of failure records, scored by
                                        created_at; each member is
                                        "<expires_at> <nonce> <record JSON>"
    neffcache:lease:{ns}:{name}         "<lease_id> <failed 0|1> <JSON of the rest>",
                                        expiring with the lease (Redis's clock)

``put_entry`` and ``add_alias`` each run as one Lua script, so they are atomic across
replicas. The scripts touch several keys, which a standalone Redis (or one primary)
allows and Redis Cluster does not. ``put_failure`` is one script on one key; the key
expires when its newest record does, so Redis itself reclaims keys nobody writes
again. A lease is one key with Redis's own expiry, so a lease's life is measured on
one clock however many replicas ask; its ``expires_at`` is that remaining life added
to the caller's clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError

from .base import Entry, Failure, Lease, PutResult, Token

# Short, so that a dead Redis fails a request (and readiness) in seconds rather than
# holding server threads for redis-py's defaults.
TIMEOUT_S = 2.0
# One retry reconnects a pooled connection that Redis closed (restart, idle timeout);
# more would only multiply the wait when Redis is down. A retried put_entry that had
# already run reports SAME instead of CREATED, which is still true.
RETRIES = 1

PREFIX = "neffcache:"
TOKENS_BY_AGE = PREFIX + "tokens"

# KEYS[1] the entry, KEYS[2] the namespace's keys, KEYS[3..] its aliases; ARGV[1] the
# entry's JSON, ARGV[2] its manifest, ARGV[3] its key.
_PUT_ENTRY = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], 0, ARGV[3])
  for i = 3, #KEYS do
    redis.call('SET', KEYS[i], ARGV[3], 'NX')
  end
  return 'created'
end
-- Listed whenever found too: an entry a server older than the listing wrote is
-- listed from its next put on (ZADD of a member already there changes nothing).
redis.call('ZADD', KEYS[2], 0, ARGV[3])
if cjson.decode(redis.call('GET', KEYS[1]))['manifest'] == ARGV[2] then
  return 'same'
end
return 'conflict'
"""

# KEYS[1] the entry, KEYS[2] the alias; ARGV[1] the key. Returns 'absent' when there
# is no entry to name.
_ADD_ALIAS = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'absent'
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX') then
  return 'created'
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return 'same'
end
return 'conflict'
"""

# KEYS[1] the key's failures, a sorted set scored by expiry; ARGV[1] "now" (the new
# record's created_at), ARGV[2] its expires_at, ARGV[3] its member, ARGV[4] how many to
# keep, ARGV[5] its lifetime in ms. No member is read: records are large and Redis runs
# one command at a time. The score is the expiry, so expired members go by score and
# trimming by rank keeps the longest-lived ones: with one TTL setting, the newest.
_PUT_FAILURE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
"""

# KEYS[1] the lease; ARGV[1] the new lease's value, ARGV[2] its lifetime in ms, ARGV[3]
# "<lease_id> " of a lease to replace, or "". Returns the lease now held (ours or the
# live one) and its remaining life in ms.
_ACQUIRE_LEASE = """
if ARGV[3] ~= '' then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, #ARGV[3]) == ARGV[3] then redis.call('DEL', KEYS[1]) end
end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] the lease; ARGV[1] "<lease_id> 0 " (held, not a failure notice), ARGV[2] the
# new lifetime in ms, or for a release "" (delete) or the failure notice's lifetime.
_RENEW_LEASE = """
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_RELEASE_LEASE = """
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  local id = string.sub(ARGV[1], 1, #ARGV[1] - 3)
  redis.call('SET', KEYS[1], id .. ' 1 ' .. string.sub(v, #ARGV[1] + 1), 'PX', ARGV[2])
end
return 1
"""
_GET_LEASE = """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"""


def _ns(namespace: str) -> str:
    # Escape ":" so that namespace "a:b" with key "c" and namespace "a" with key "b:c"
    # get different Redis keys; "%" too, so the escaping cannot collide with itself.
    return namespace.replace("%", "%25").replace(":", "%3A")


def _entry_key(namespace: str, key: str) -> str:
    return f"{PREFIX}entry:{_ns(namespace)}:{key}"


def _keys_key(namespace: str) -> str:
    return f"{PREFIX}keys:{_ns(namespace)}"


def _alias_key(namespace: str, alias: str) -> str:
    return f"{PREFIX}alias:{_ns(namespace)}:{alias}"


def _failures_key(namespace: str, key: str) -> str:
    return f"{PREFIX}failures:{_ns(namespace)}:{key}"


def _lease_key(namespace: str, name: str) -> str:
    return f"{PREFIX}lease:{_ns(namespace)}:{name}"


def _lease_value(lease: Lease) -> str:
    rest = {
        "holder": lease.holder,
        "acquired_at": lease.acquired_at,
        "expected_seconds": lease.expected_seconds,
    }
    return f"{lease.lease_id} {int(lease.failed)} {json.dumps(rest)}"


def _lease_from(
    namespace: str, name: str, value: str | None, ttl_ms: int, now: float
) -> Lease | None:
    if value is None:
        return None
    # Present is live: PTTL is 0 in a lease's last millisecond, and -1 (no expiry)
    # cannot happen to a key only ever written with PX; both count as live now.
    lease_id, failed, rest = value.split(" ", 2)
    fields = json.loads(rest)
    return Lease(
        namespace=namespace,
        name=name,
        lease_id=lease_id,
        holder=fields["holder"],
        acquired_at=fields["acquired_at"],
        expires_at=now + max(ttl_ms, 1) / 1000,
        expected_seconds=fields["expected_seconds"],
        failed=failed == "1",
    )


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _token_key(token_id: str) -> str:
    return f"{PREFIX}token:{token_id}"


def _token_hash_key(secret_hash: str) -> str:
    return f"{PREFIX}token-hash:{secret_hash}"


class RedisIndex:
    """An index in a Redis database.

    >>> index = RedisIndex.from_url("redis://redis.internal:6379/0")
    >>> index.check()  # raises StoreError within seconds if Redis is down
    """

    def __init__(self, client: redis.Redis, *, where: str = "redis") -> None:
        """``client`` must decode responses; ``where`` names it in errors (no secrets)."""
        self._redis = client
        self._where = where
        self._put_entry = client.register_script(_PUT_ENTRY)
        self._add_alias = client.register_script(_ADD_ALIAS)
        self._put_failure = client.register_script(_PUT_FAILURE)
        self._acquire_lease = client.register_script(_ACQUIRE_LEASE)
        self._renew_lease = client.register_script(_RENEW_LEASE)
        self._release_lease = client.register_script(_RELEASE_LEASE)
        self._get_lease = client.register_script(_GET_LEASE)

    @classmethod
    def from_url(cls, url: str) -> RedisIndex:
        try:
            client = redis.Redis.from_url(
                url,
                decode_responses=True,
                socket_timeout=TIMEOUT_S,
                socket_connect_timeout=TIMEOUT_S,
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), RETRIES),
            )
        except ValueError as exc:
            raise ConfigError(f"bad redis index URL: {exc}; use redis://host:port/db") from exc
        return cls(client, where=_redacted(url))

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """Turn redis-py errors into the store error the API maps to 503."""
        try:
            yield
        except redis.RedisError as exc:
            raise StoreError(f"redis index {self._where}: {exc}") from exc

    # --- entries ----------------------------------------------------------------------

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        stored = {
            "manifest": entry.manifest,
            "created_at": entry.created_at,
            "writer": entry.writer,
        }
        keys = [_entry_key(entry.namespace, entry.key), _keys_key(entry.namespace)]
        keys += [_alias_key(entry.namespace, alias) for alias in aliases]
        # ensure_ascii=False: the script's cjson then sees the manifest as the same UTF-8
        # bytes as ARGV[2], with no \\u escapes to translate.
        args = [json.dumps(stored, ensure_ascii=False), entry.manifest, entry.key]
        with self._mapped():
            return PutResult(self._put_entry(keys=keys, args=args))

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        with self._mapped():
            raw = _opt_str(self._redis.get(_entry_key(namespace, key)))
        if raw is None:
            return None
        stored = json.loads(raw)
        return Entry(namespace, key, stored["manifest"], stored["created_at"], stored["writer"])

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        with self._mapped():
            return _opt_str(self._redis.get(_alias_key(namespace, alias)))

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        keys = [_entry_key(namespace, key), _alias_key(namespace, alias)]
        with self._mapped():
            result = _str(self._add_alias(keys=keys, args=[key]))
        return None if result == "absent" else PutResult(result)

    # --- failures ---------------------------------------------------------------------

    def put_failure(self, failure: Failure, keep: int) -> None:
        # The nonce keeps two identical records of one instant two members.
        member = f"{failure.created_at!r} {secrets.token_hex(8)} {failure.record}"
        # Relative, on Redis's clock: replicas' clocks may differ from Redis's.
        lifetime_ms = max(1, math.ceil((failure.expires_at - failure.created_at) * 1000))
        keys = [_failures_key(failure.namespace, failure.key)]
        args: list[EncodableT] = [
            repr(failure.created_at),
            repr(failure.expires_at),
            member,
            keep,
            lifetime_ms,
        ]
        with self._mapped():
            self._put_failure(keys=keys, args=args)

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        with self._mapped():
            found = self._redis.zrevrange(_failures_key(namespace, key), 0, -1, withscores=True)
        assert isinstance(found, list), type(found)
        records = []
        for pair in found:
            assert isinstance(pair, tuple), type(pair)  # withscores: (member, score)
            member, expires_at = pair
            created_at, _nonce, record = _str(member).split(" ", 2)
            if float(expires_at) > now:
                records.append(
                    Failure(namespace, key, record, float(created_at), float(expires_at))
                )
        records.sort(key=lambda f: f.created_at, reverse=True)  # newest first
        return records

    # --- leases -----------------------------------------------------------------------

    def acquire_lease(self, lease: Lease, replacing: str | None = None) -> Lease:
        keys = [_lease_key(lease.namespace, lease.name)]
        args: list[EncodableT] = [
            _lease_value(lease),
            _ms(lease.expires_at - lease.acquired_at),
            f"{replacing} " if replacing else "",
        ]
        with self._mapped():
            value, ttl_ms = self._acquire_lease(keys=keys, args=args)
        held = _lease_from(lease.namespace, lease.name, value, ttl_ms, lease.acquired_at)
        if held is None:  # the script SETs, then GETs, atomically: there is a value
            raise StoreError(f"redis index {self._where}: lease {keys[0]} vanished")
        return lease if held.lease_id == lease.lease_id else held

    def renew_lease(self, namespace: str, name: str, lease_id: str, expires_at: float) -> bool:
        args: list[EncodableT] = [f"{lease_id} 0 ", _ms(expires_at - time.time())]
        with self._mapped():
            return bool(self._renew_lease(keys=[_lease_key(namespace, name)], args=args))

    def release_lease(
        self, namespace: str, name: str, lease_id: str, failed_until: float | None
    ) -> bool:
        life = "" if failed_until is None else str(_ms(failed_until - time.time()))
        args: list[EncodableT] = [f"{lease_id} 0 ", life]
        with self._mapped():
            return bool(self._release_lease(keys=[_lease_key(namespace, name)], args=args))

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        with self._mapped():
            value, ttl_ms = self._get_lease(keys=[_lease_key(namespace, name)], args=[])
        return _lease_from(namespace, name, value, ttl_ms, now)

    # --- tokens -----------------------------------------------------------------------

    def put_token(self, token: Token) -> None:
        fields: dict[FieldT, EncodableT] = {
            "secret_hash": token.secret_hash,
            "scope": token.scope,
            "namespaces": json.dumps(list(token.namespaces)),
            "name": token.name,
            "created_at": repr(token.created_at),
            "revoked": "1" if token.revoked else "0",
        }
        # MULTI/EXEC: a reader never sees the hash lookup without the token it names.
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(_token_key(token.token_id), mapping=fields)
        pipe.set(_token_hash_key(token.secret_hash), token.token_id)
        pipe.zadd(TOKENS_BY_AGE, {token.token_id: token.created_at})
        with self._mapped():
            pipe.execute()

    def token_by_hash(self, secret_hash: str) -> Token | None:
        with self._mapped():
            token_id = _opt_str(self._redis.get(_token_hash_key(secret_hash)))
            if token_id is None:
                return None
            token = _token(token_id, self._redis.hgetall(_token_key(token_id)))
        # The lookup key could outlive a token rewritten under the same id: trust only
        # a record whose own hash is the one asked for.
        return token if token is not None and token.secret_hash == secret_hash else None

    def tokens(self) -> list[Token]:
        with self._mapped():
            # Equal scores come back ordered by member, i.e. by token_id.
            token_ids = [_str(t) for t in self._redis.zrange(TOKENS_BY_AGE, 0, -1)]
            pipe = self._redis.pipeline(transaction=False)
            for token_id in token_ids:
                pipe.hgetall(_token_key(token_id))
            found = pipe.execute()
        return [_token(token_id, fields) for token_id, fields in zip(token_ids, found, strict=True)]

    def revoke_token(self, token_id: str) -> bool:
        key = _token_key(token_id)
        with self._mapped():
            # Tokens are never deleted, so one that exists now still exists for the HSET.
            if not self._redis.exists(key):
                return False
            self._redis.hset(key, "revoked", "1")
            return True

    # --- lifecycle --------------------------------------------------------------------

    def check(self) -> None:
        with self._mapped():
            self._redis.ping()

    def close(self) -> None:
        with self._mapped():
            self._redis.close()

    # --- listing

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        # "(" excludes ``after`` itself; "-" is the lowest member.
        start = "-" if after is None else f"({after}"
        with self._mapped():
            found = self._redis.zrangebylex(_keys_key(namespace), start, "+", 0, limit)
            keys = [_str(k) for k in found]
            raws = self._redis.mget([_entry_key(namespace, k) for k in keys]) if keys else []
        entries = []
        for key, raw in zip(keys, raws, strict=True):
            if raw is None:  # entries are never deleted; were one, it would be skipped
                continue
            stored = json.loads(_str(raw))
            created_at, writer = stored["created_at"], stored["writer"]
            entries.append(Entry(namespace, key, stored["manifest"], created_at, writer))
        return entries


def _redacted(url: str) -> str:
    """host:port/db, without the credentials a URL may carry."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"


def _str(value: object) -> str:
    # redis-py's annotations allow bytes; a client that decodes responses returns str.
    assert isinstance(value, str), type(value)
    return value


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _token(token_id: str, fields: object) -> Token:
    assert isinstance(fields, dict), type(fields)
    return Token(
        token_id=token_id,
        secret_hash=fields["secret_hash"],
        scope=fields["scope"],
        namespaces=tuple(json.loads(fields["namespaces"])),
        name=fields["name"],
        created_at=float(fields["created_at"]),
        revoked=fields["revoked"] == "1",
    )
