"""The primitives (primitives.py) in Redis: ``RedisCells``, ``RedisLogs`` and
``RedisMaps``, under the index's key prefix. Expiry is Redis's own (PX, PEXPIRE): a
lifetime is measured on one clock however many replicas ask, and a time read back is
what is left of it added to the caller's ``now``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import redis
from redis.typing import EncodableT

from .primitives import ANY_TIME, Cell

# Every key the index writes starts with it.
PREFIX = "neffcache:"

# KEYS[1] the log, a sorted set scored by expiry; ARGV[1] "now", ARGV[2] the item's
# score, ARGV[3] the item, ARGV[4] how many to keep, ARGV[5] the item's lifetime in
# ms. No item is read: failure records are large and Redis runs one command at a time.
_ADD_TO_LOG = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
"""

# KEYS[1] the cell; ARGV[1] its value, ARGV[2] its lifetime in ms. Returns nil when
# stored, else the value there and its remaining life in ms (an expired key reads as
# absent, in a script too).
_PUT_NEW_CELL = """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return nil
end
return {held, redis.call('PTTL', KEYS[1])}
"""
# KEYS[1] the cell; ARGV[1] the value it must hold, ARGV[2] the new value, ARGV[3] its
# lifetime in ms. Returns 1 when replaced.
_SWAP_CELL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
# KEYS[1] the cell; ARGV[1] the head its value must start with, ARGV[2] its lifetime
# in ms, ARGV[3] the new head (none: delete the cell). Returns 1 when changed. Lua's
# strings are bytes, and so are the lengths compared.
_SWAP_HEAD = """
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
if ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[3] .. string.sub(held, #ARGV[1] + 1), 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
"""
# KEYS[1] the map, a hash; ARGV[1] the field, ARGV[2] the value it must hold, ARGV[3]
# its new value (none: delete it). Returns 1 when changed.
_SWAP_FIELD = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""


def escaped(namespace: str) -> str:
    # Escape ":" so that namespace "a:b" with key "c" and namespace "a" with key "b:c"
    # get different Redis keys; "%" too, so the escaping cannot collide with itself.
    return namespace.replace("%", "%25").replace(":", "%3A")


def lifetime_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def as_str(value: object) -> str:
    # redis-py's annotations allow bytes; a client that decodes responses returns str.
    assert isinstance(value, str), type(value)
    return value


class RedisCells:
    """``Cells`` as Redis strings under ``neffcache:{key}``, expiring by Redis's own
        clock (PX): a cell's life is measured on one clock however many replicas ask, and
        ``get`` adds what is left of it to the caller's ``now``. The two compare-and-sets
        are one script each, and so is put_new (SET NX PX, and on
    failure what is there)."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._put_new = client.register_script(_PUT_NEW_CELL)
        self._swap = client.register_script(_SWAP_CELL)
        self._swap_head = client.register_script(_SWAP_HEAD)

    def get(self, key: str, now: float) -> Cell | None:
        if now == ANY_TIME:  # the value alone: no life to read
            with self._mapped():
                value = self._redis.get(PREFIX + key)
            return None if value is None else Cell(as_str(value), ANY_TIME)
        # MULTI/EXEC: the value and its life at one moment.
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(PREFIX + key)
        pipe.pttl(PREFIX + key)
        with self._mapped():
            value, ttl_ms = pipe.execute()
        return None if value is None else _cell(value, ttl_ms, now)

    def put_new(self, key: str, value: str, now: float, expires_at: float) -> Cell | None:
        args: list[EncodableT] = [value, lifetime_ms(expires_at - now)]
        with self._mapped():
            found = self._put_new(keys=[PREFIX + key], args=args)
        if found is None:
            return None
        held, ttl_ms = found
        return _cell(held, ttl_ms, now)

    def swap(self, key: str, expected: str, value: str, now: float, expires_at: float) -> bool:
        args: list[EncodableT] = [expected, value, lifetime_ms(expires_at - now)]
        with self._mapped():
            return bool(self._swap(keys=[PREFIX + key], args=args))

    def swap_head(
        self, key: str, head: str, new_head: str | None, now: float, expires_at: float
    ) -> bool:
        args: list[EncodableT] = [head, lifetime_ms(expires_at - now)]
        if new_head is not None:
            args.append(new_head)
        with self._mapped():
            return bool(self._swap_head(keys=[PREFIX + key], args=args))


class RedisLogs:
    """``Logs`` as sorted sets under ``neffcache:{log}``, scored by expiry: an add is
    one script, and the key expires with its longest-lived item (by Redis's clock),
    so Redis itself reclaims logs nobody writes to again."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._add = client.register_script(_ADD_TO_LOG)

    def add(self, log: str, item: str, score: float, keep: int, now: float) -> None:
        # The life is relative, on Redis's clock: replicas' clocks may differ from it.
        args: list[EncodableT] = [repr(now), repr(score), item, keep, lifetime_ms(score - now)]
        with self._mapped():
            self._add(keys=[PREFIX + log], args=args)

    def read(self, log: str, now: float) -> list[tuple[str, float]]:
        with self._mapped():
            found = self._redis.zrangebyscore(PREFIX + log, f"({now!r}", "+inf", withscores=True)
        assert isinstance(found, list), type(found)
        items = []
        for pair in found:
            assert isinstance(pair, tuple), type(pair)  # withscores: (member, score)
            items.append((as_str(pair[0]), float(pair[1])))
        return items


class RedisMaps:
    """``Maps`` as hashes under ``neffcache:{name}``: HGET, HSETNX and HGETALL, and
    one script for the compare-and-set and the conditional delete."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._swap = client.register_script(_SWAP_FIELD)

    def get(self, name: str, field: str) -> str | None:
        with self._mapped():
            value = self._redis.hget(PREFIX + name, field)
        return None if value is None else as_str(value)

    def put_new(self, name: str, field: str, value: str) -> bool:
        with self._mapped():
            return bool(self._redis.hsetnx(PREFIX + name, field, value))

    def swap(self, name: str, field: str, expected: str, value: str) -> bool:
        with self._mapped():
            return bool(self._swap(keys=[PREFIX + name], args=[field, expected, value]))

    def delete_if(self, name: str, field: str, expected: str) -> bool:
        with self._mapped():
            return bool(self._swap(keys=[PREFIX + name], args=[field, expected]))

    def items(self, name: str) -> dict[str, str]:
        with self._mapped():
            found = self._redis.hgetall(PREFIX + name)
        assert isinstance(found, dict), type(found)
        return {as_str(field): as_str(value) for field, value in found.items()}


def _cell(value: object, ttl_ms: object, now: float) -> Cell:
    # Present is live: PTTL is 0 in a cell's last millisecond, and -1 (no expiry)
    # cannot happen to a key only ever written with PX; both count as live now.
    assert isinstance(ttl_ms, int), type(ttl_ms)
    return Cell(as_str(value), now + max(ttl_ms, 1) / 1000)
