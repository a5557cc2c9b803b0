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
    neffcache:stats:{ns}                hash: key -> JSON {"created_at", "writer", and
                                        the EntryFacts fields}
    neffcache:access:{ns}               hash: key -> last_access (a Python repr)
    neffcache:hits:{ns}                 hash: key -> hits
    neffcache:entry-aliases:{ns}:{key}  set of the aliases naming the key
    neffcache:namespaces                set of the namespaces ever written to
    neffcache:records:{kind}            hash: JSON [namespace, name] -> value
    neffcache:audit                     sorted set of audit records, scored by ``at``;
                                        each member is "<seq, 20 digits> <JSON>"
    neffcache:audit-seq                 the last seq handed out
    neffcache:events                    sorted set of telemetry events, scored by the
                                        server's ``at``; each member is
                                        "<seq, 20 digits> <at> <JSON [ns, kind, key]>\n<body>"
    neffcache:events-seq                the last seq handed out
    neffcache:events:{ns}:{key}         list of the key's newest events (their members
                                        in neffcache:events), the latest pushed first;
                                        expires a retention after its last write
    neffcache:events-ns:{ns}            sorted set of the namespace's events, scored
                                        by ``at``; each member is "<seq, 20 digits>
                                        <body bytes>", so its oldest are found without
                                        walking the log
    neffcache:events-bytes              hash: namespace -> the body bytes of its
                                        events that have a member in its sorted set

``put_entry``, ``add_alias``, ``delete_entry``, ``touch_entries`` (per batch),
``append_audit`` and ``append_events`` (per batch) each run as one Lua script, so they
are atomic across replicas. The scripts touch several keys, some of them named inside
the script (the aliases an entry loses, the entry an alias names, the lists and
namespace sets of the events an append drops), which a standalone Redis (or one
primary) allows and Redis Cluster does not. ``put_failure`` is one script on one
key; the key expires when its newest record does, so Redis itself reclaims keys
nobody writes again. A lease is one key with Redis's own expiry, so a lease's life is measured on
one clock however many replicas ask; its ``expires_at`` is that remaining life added
to the caller's clock.

The entry key is the truth: an entry is there when its key is. Its stats, access time
and hits live beside it, written and deleted with it; an entry written before they
existed reads with its facts computed from its manifest, ``last_access`` =
``created_at`` and no hits. Times pass through Lua as Python reprs and are compared
with ``tonumber``: both parse to the same double, so equality is exact, and a time is
written back as the string it came as, never as Lua formats a number (14 digits).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError

from .base import (
    AuditRecord,
    Entry,
    EntryFacts,
    EntryStats,
    Event,
    Failure,
    Lease,
    PutResult,
    Record,
    Token,
    Touch,
    entry_facts,
    event_cursor,
    events_start,
)

log = logging.getLogger("neffcache.server.index")

# Short, so that a dead Redis fails a request (and readiness) in seconds rather than
# holding server threads for redis-py's defaults.
TIMEOUT_S = 2.0
# One retry reconnects a pooled connection that Redis closed (restart, idle timeout);
# more would only multiply the wait when Redis is down. A retried put_entry that had
# already run reports SAME instead of CREATED, which is still true; a retried
# delete_entry reports False for an entry it deleted; a retried touch batch may count
# its hits twice and a retried append_audit or append_events log its records twice,
# which eviction (an estimate of use), readers of the log and reports tolerate.
RETRIES = 1

PREFIX = "neffcache:"
TOKENS_BY_AGE = PREFIX + "tokens"
NAMESPACES = PREFIX + "namespaces"
# When this database first held eviction data (set once): an entry written before has no
# access time, and counts as last served then, not when it was created, so an upgrade
# does not expire every old entry however much it is used.
EVICTION_SINCE = PREFIX + "eviction-since"
AUDIT = PREFIX + "audit"
AUDIT_SEQ = PREFIX + "audit-seq"
EVENTS = PREFIX + "events"
EVENTS_SEQ = PREFIX + "events-seq"
EVENT_LISTS = PREFIX + "events:"  # then "{ns}:{key}"
EVENTS_BY_NS = PREFIX + "events-ns:"  # then "{ns}"
EVENTS_BYTES = PREFIX + "events-bytes"

# Touches per script call: each call holds Redis for its whole batch.
TOUCH_BATCH = 500
# Audit records read per round trip; one namespace's are picked out in Python.
AUDIT_PAGE = 500
# Events per append script: each call holds Redis for its whole batch.
EVENTS_BATCH = 500
# Events read per round trip when only some namespaces are wanted (picked out in Python).
EVENTS_PAGE = 500
# Events kept per (namespace, key) for events_for_key: explanations read a few.
EVENTS_PER_KEY = 100
# Events dropped from the log per script call at most (a lowered events_keep drops
# many at once): each call holds Redis for its whole batch.
TRIM_BATCH = 5000

# Shared by the alias-writing scripts: make the alias at ``alias_key`` (named ``alias``)
# name ``key`` unless it names another entry that exists; an alias naming a key with no
# entry (deleted) is free. Each key's set of aliases follows, so that delete_entry
# finds them; SADD on SAME repairs the set of an alias written before sets existed.
# ``entry_prefix`` and ``set_prefix`` are the namespace's entry and alias-set key
# prefixes, to which a key is appended.
_CLAIM_ALIAS = """
local function claim(alias_key, alias, key, entry_prefix, set_prefix)
  local named = redis.call('GET', alias_key)
  if named == key then
    redis.call('SADD', set_prefix .. key, alias)
    return 'same'
  end
  if named and redis.call('EXISTS', entry_prefix .. named) == 1 then
    return 'conflict'
  end
  redis.call('SET', alias_key, key)
  redis.call('SADD', set_prefix .. key, alias)
  if named then
    redis.call('SREM', set_prefix .. named, alias)
  end
  return 'created'
end
"""

# KEYS[1] the entry, KEYS[2] the namespace's keys, KEYS[3] its stats, KEYS[4] its
# access times, KEYS[5] its hits, KEYS[6] the set of namespaces, KEYS[7..] the
# aliases; ARGV[1] the entry's JSON, ARGV[2] its manifest, ARGV[3] its key, ARGV[4] its
# stats JSON, ARGV[5] its created_at, ARGV[6] the namespace, ARGV[7] and ARGV[8] the
# prefixes claim() takes, ARGV[9..] the aliases' names, in the order of KEYS[7..].
_PUT_ENTRY = (
    _CLAIM_ALIAS
    + """
-- Listed whenever found too: an entry a server older than the listing wrote is
-- listed from its next put on (ZADD of a member already there changes nothing).
redis.call('ZADD', KEYS[2], 0, ARGV[3])
redis.call('SADD', KEYS[6], ARGV[6])
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  if cjson.decode(redis.call('GET', KEYS[1]))['manifest'] == ARGV[2] then
    return 'same'
  end
  return 'conflict'
end
-- Overwrites whatever an entry deleted under this key could have left.
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[5])
redis.call('HSET', KEYS[5], ARGV[3], 0)
for i = 7, #KEYS do
  claim(KEYS[i], ARGV[i + 2], ARGV[3], ARGV[7], ARGV[8])
end
return 'created'
"""
)

# KEYS[1] the entry, KEYS[2] the alias; ARGV[1] the key, ARGV[2] the alias's name,
# ARGV[3] and ARGV[4] the prefixes claim() takes. Returns 'absent' when there is no
# entry to name.
_ADD_ALIAS = (
    _CLAIM_ALIAS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'absent'
end
return claim(KEYS[2], ARGV[2], ARGV[1], ARGV[3], ARGV[4])
"""
)

# KEYS[1] the entry, KEYS[2] the namespace's keys, KEYS[3] stats, KEYS[4] access
# times, KEYS[5] hits, KEYS[6] the key's set of aliases; ARGV[1] the key, ARGV[2] the
# expected created_at, ARGV[3] the namespace's alias key prefix. An alias in the set
# that names another key by now (re-pointed after a deletion that predates the sets)
# is left alone.
_DELETE_ENTRY = """
local raw = redis.call('GET', KEYS[1])
if not raw or cjson.decode(raw)['created_at'] ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
for _, alias in ipairs(redis.call('SMEMBERS', KEYS[6])) do
  local alias_key = ARGV[3] .. alias
  if redis.call('GET', alias_key) == ARGV[1] then
    redis.call('DEL', alias_key)
  end
end
redis.call('DEL', KEYS[6])
return 1
"""

# Per touch, three KEYS (the entry, the namespace's access times, its hits) and three
# ARGV (the key, the time, the hits). Only an entry whose key exists is touched, so a
# touch racing a deletion never leaves stats behind. An entry written before access
# times were kept has none: the later of its created_at and EVICTION_SINCE (the last
# ARGV) stands in, as entry_stats reads it.
_TOUCH_ENTRIES = """
for i = 1, #KEYS, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local key, at = ARGV[i], ARGV[i + 1]
    local last = redis.call('HGET', KEYS[i + 1], key)
    if last then
      last = tonumber(last)
    else
      last = math.max(cjson.decode(redis.call('GET', KEYS[i]))['created_at'], tonumber(ARGV[#ARGV]))
    end
    if tonumber(at) > last then
      redis.call('HSET', KEYS[i + 1], key, at)
    end
    redis.call('HINCRBY', KEYS[i + 2], key, ARGV[i + 2])
  end
end
"""

# A log in a sorted set, shared by the audit log and the events: each record is scored
# by its time, and its member starts with a zero-padded sequence, so members of one
# instant sort (and so read back) in order of appending. log_add returns the member.
# log_trim drops records older than ``before`` (a time, or '-inf' for none), then all
# but the ``keep`` newest by rank: both drop the oldest by (time, sequence), the order
# the log is read in, so what is left is always a suffix of what was written.
_LOG = """
local function log_add(log, seq_key, at, text)
  local member = string.format('%020d', redis.call('INCR', seq_key)) .. ' ' .. text
  redis.call('ZADD', log, at, member)
  return member
end
local function log_trim(log, keep, before)
  redis.call('ZREMRANGEBYSCORE', log, '-inf', '(' .. before)
  redis.call('ZREMRANGEBYRANK', log, 0, -(tonumber(keep) + 1))
end
"""

# KEYS[1] the audit log, KEYS[2] its sequence; ARGV[1] how many to keep, then per record
# its time and its JSON.
_APPEND_AUDIT = (
    _LOG
    + """
for i = 2, #ARGV, 2 do
  log_add(KEYS[1], KEYS[2], ARGV[i], ARGV[i + 1])
end
log_trim(KEYS[1], ARGV[1], '-inf')
"""
)

# KEYS[1] the events log, KEYS[2] its sequence, KEYS[3] the namespaces' bytes,
# KEYS[4..] the key lists of this batch; ARGV[1] how many to keep, ARGV[2] ``before``,
# ARGV[3] how many per key, ARGV[4] the lists' lifetime in ms, ARGV[5] the key lists'
# prefix, ARGV[6] how many to drop at most (TRIM_BATCH), ARGV[7] the namespaces' byte
# bound ('' for none), ARGV[8] the namespace sets' prefix, ARGV[9] how many
# namespaces to bound, then their names, then per event its time, its text ("<time>
# <JSON [ns, kind, key]>" and a newline, then the body) and the index in KEYS of its
# key's list (0 for none). A list item, and a namespace set's member, stand for the
# event's member in the log, so that what leaves the log leaves them too; the lists'
# expiry only reclaims keys nobody writes to again. An event stored before the
# namespace sets existed has no member in one: its bytes were never counted, and are
# not taken off. Returns 1 when more are due to be dropped.
_APPEND_EVENTS = (
    _LOG
    + r"""
local function escaped(ns)
  return (string.gsub(string.gsub(ns, '%%', '%%25'), ':', '%%3A'))
end
-- The namespace, the key and the body's bytes of a log member.
local function facts(member)
  local header = string.match(member, '^%d+ %S+ ([^\n]*)')
  local fields = cjson.decode(header)
  return fields[1], fields[3], #member - string.find(member, '\n', 1, true)
end
local function ref(member, size)
  return string.sub(member, 1, 20) .. ' ' .. size
end
local function uncount(ns, size)
  if redis.call('HINCRBY', KEYS[3], ns, -size) <= 0 then redis.call('HDEL', KEYS[3], ns) end
end
-- Forget a member leaving the log (the caller removes it from the log).
local function forget(member)
  local ns, key, size = facts(member)
  if key ~= '' then redis.call('LREM', ARGV[5] .. escaped(ns) .. ':' .. key, 1, member) end
  if redis.call('ZREM', ARGV[8] .. escaped(ns), ref(member, size)) == 1 then uncount(ns, size) end
end
local function drop_oldest(members)
  if #members == 0 then return end
  for _, member in ipairs(members) do forget(member) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #members - 1)
end
-- The log's member of time ``at`` and sequence ``seq``, or nil: members of one time
-- follow every earlier one by rank, and sort among themselves by their sequence.
local function member_at(at, seq)
  local lo = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. at)
  local hi = lo + redis.call('ZCOUNT', KEYS[1], at, at) - 1
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local member = redis.call('ZRANGE', KEYS[1], mid, mid)[1]
    local found = string.sub(member, 1, 20)
    if found == seq then return member end
    if found < seq then lo = mid + 1 else hi = mid - 1 end
  end
  return nil
end
-- Drop the namespace's oldest while its bytes are over the bound, at most ``budget``;
-- returns how many it dropped.
local function trim_namespace(ns, bound, budget)
  local set = ARGV[8] .. escaped(ns)
  local dropped = 0
  while dropped < budget and tonumber(redis.call('HGET', KEYS[3], ns) or '0') > bound do
    local oldest = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if #oldest == 0 then
      redis.call('HDEL', KEYS[3], ns)
      break
    end
    local member = member_at(oldest[2], string.sub(oldest[1], 1, 20))
    if member then
      forget(member)
      redis.call('ZREM', KEYS[1], member)
    else
      -- Its event left the log without it (a trim by an older server): so do its bytes.
      redis.call('ZREM', set, oldest[1])
      uncount(ns, tonumber(string.match(oldest[1], ' (%d+)$')))
    end
    dropped = dropped + 1
  end
  return dropped
end
local bounded = tonumber(ARGV[9])
for i = 10 + bounded, #ARGV, 3 do
  local member = log_add(KEYS[1], KEYS[2], ARGV[i], ARGV[i + 1])
  local slot = tonumber(ARGV[i + 2])
  if slot > 0 then redis.call('LPUSH', KEYS[slot], member) end
  local ns, _, size = facts(member)
  redis.call('ZADD', ARGV[8] .. escaped(ns), ARGV[i], ref(member, size))
  redis.call('HINCRBY', KEYS[3], ns, size)
end
for j = 4, #KEYS do
  redis.call('LTRIM', KEYS[j], 0, tonumber(ARGV[3]) - 1)
  redis.call('PEXPIRE', KEYS[j], ARGV[4])
end
-- The oldest by (time, sequence) are the lowest ranks: first those past ``before``,
-- then past ``keep``, then a namespace's past its bound.
local budget = tonumber(ARGV[6])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, budget)
drop_oldest(old)
budget = budget - #old
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 and budget > 0 then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, math.min(excess, budget) - 1)
  drop_oldest(oldest)
  budget = budget - #oldest
end
if redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[1]) then return 1 end
if #redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, 1) > 0 then
  return 1
end
if ARGV[7] ~= '' then
  local bound = tonumber(ARGV[7])
  for n = 10, 9 + bounded do
    budget = budget - trim_namespace(ARGV[n], bound, budget)
    if tonumber(redis.call('HGET', KEYS[3], ARGV[n]) or '0') > bound then return 1 end
  end
end
return 0
"""
)

# KEYS[1] the events log; ARGV[1] the cursor's time, ARGV[2] its zero-padded sequence
# (members of that time up to it are skipped), ARGV[3] the exclusive upper bound
# "(<until>", ARGV[4] how many. Atomic, so that the count skipped is exact however the
# log changes between pages: a batch's events share one time, so one time can hold
# many members, and a cursor may stop among them (those it passed come first).
_READ_EVENTS = """
local skip = 0
while true do
  local chunk = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', skip, 100)
  local passed = 0
  for _, member in ipairs(chunk) do
    if string.sub(member, 1, 20) > ARGV[2] then break end
    passed = passed + 1
  end
  skip = skip + passed
  if passed < 100 then break end
end
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[3], 'LIMIT', skip, ARGV[4])
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
# KEYS[1] the kind's records; ARGV[1] the field, ARGV[2] the new value, ARGV[3] the value
# it must hold now. Returns 1 when replaced.
_REPLACE_RECORD = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
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


def _stats_key(namespace: str) -> str:
    return f"{PREFIX}stats:{_ns(namespace)}"


def _access_key(namespace: str) -> str:
    return f"{PREFIX}access:{_ns(namespace)}"


def _hits_key(namespace: str) -> str:
    return f"{PREFIX}hits:{_ns(namespace)}"


def _entry_aliases_key(namespace: str, key: str) -> str:
    return f"{PREFIX}entry-aliases:{_ns(namespace)}:{key}"


def _records_key(kind: str) -> str:
    return f"{PREFIX}records:{kind}"


def _record_field(namespace: str, name: str) -> str:
    # JSON: no separator a namespace or name could contain makes two records meet.
    return json.dumps([namespace, name])


def _events_key(namespace: str, key: str) -> str:
    # The append script builds the same name from EVENT_LISTS, escaping as _ns does.
    return f"{EVENT_LISTS}{_ns(namespace)}:{key}"


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
        self._eviction_since: float | None = None
        self._put_entry = client.register_script(_PUT_ENTRY)
        self._add_alias = client.register_script(_ADD_ALIAS)
        self._delete_entry = client.register_script(_DELETE_ENTRY)
        self._touch_entries = client.register_script(_TOUCH_ENTRIES)
        self._append_audit = client.register_script(_APPEND_AUDIT)
        self._append_events = client.register_script(_APPEND_EVENTS)
        self._read_events = client.register_script(_READ_EVENTS)
        self._put_failure = client.register_script(_PUT_FAILURE)
        self._acquire_lease = client.register_script(_ACQUIRE_LEASE)
        self._renew_lease = client.register_script(_RENEW_LEASE)
        self._release_lease = client.register_script(_RELEASE_LEASE)
        self._get_lease = client.register_script(_GET_LEASE)
        self._replace_record = client.register_script(_REPLACE_RECORD)

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
        index = cls(client, where=_redacted(url))
        index.warn_if_evicting()
        return index

    def warn_if_evicting(self) -> bool:
        """Log a warning when Redis may evict keys under memory pressure: a policy
        other than ``noeviction`` drops index rows one by one, unnoticed (a wipe is
        noticed: recovery/durable.py), and blob collection would then take the lost
        rows' blobs. True when it warned. Best effort: managed Redis services often
        refuse CONFIG, and then nothing is said (docs/operations.md says what to set)."""
        try:
            policy = self._redis.config_get("maxmemory-policy").get("maxmemory-policy")
            limit = self._redis.config_get("maxmemory").get("maxmemory")
        except redis.RedisError:
            return False
        if policy in (None, "noeviction") or str(limit) == "0":
            return False
        log.warning(
            "redis index %s has maxmemory %s with maxmemory-policy %s: Redis may drop "
            "index rows; set maxmemory-policy noeviction (docs/operations.md)",
            self._where,
            limit,
            policy,
        )
        return True

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """Turn redis-py errors into the store error the API maps to 503."""
        try:
            yield
        except redis.RedisError as exc:
            raise StoreError(f"redis index {self._where}: {exc}") from exc

    # --- entries ----------------------------------------------------------------------

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        ns = entry.namespace
        stored = {
            "manifest": entry.manifest,
            "created_at": entry.created_at,
            "writer": entry.writer,
        }
        keys = [
            _entry_key(ns, entry.key),
            _keys_key(ns),
            _stats_key(ns),
            _access_key(ns),
            _hits_key(ns),
            NAMESPACES,
        ]
        keys += [_alias_key(ns, alias) for alias in aliases]
        # ensure_ascii=False: the script's cjson then sees the manifest as the same UTF-8
        # bytes as ARGV[2], with no \\u escapes to translate.
        args = [
            json.dumps(stored, ensure_ascii=False),
            entry.manifest,
            entry.key,
            _stats_json(entry, entry_facts(entry.manifest)),
            repr(entry.created_at),
            ns,
            _entry_key(ns, ""),
            _entry_aliases_key(ns, ""),
            *aliases,
        ]
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

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        with self._mapped():
            members = sorted(
                _str(a) for a in self._redis.smembers(_entry_aliases_key(namespace, key))
            )
            named = self._redis.mget([_alias_key(namespace, a) for a in members]) if members else []
        # Checked against each alias itself: the set is delete_entry's bookkeeping,
        # the alias's own key is what a lookup follows.
        return [a for a, k in zip(members, named, strict=True) if _opt_str(k) == key]

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        keys = [_entry_key(namespace, key), _alias_key(namespace, alias)]
        args = [key, alias, _entry_key(namespace, ""), _entry_aliases_key(namespace, "")]
        with self._mapped():
            result = _str(self._add_alias(keys=keys, args=args))
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
            "trusted": "1" if token.trusted else "0",
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
            if raw is None:  # deleted since the listing
                continue
            stored = json.loads(_str(raw))
            created_at, writer = stored["created_at"], stored["writer"]
            entries.append(Entry(namespace, key, stored["manifest"], created_at, writer))
        return entries

    # --- eviction

    def _upgraded(self) -> float:
        """Once per process: note when eviction data began, and list every namespace
        holding entries (a database written before ``namespaces`` existed lists none,
        and blobs its entries reference would look unreferenced). Idempotent."""
        if self._eviction_since is None:
            with self._mapped():
                self._redis.set(EVICTION_SINCE, repr(time.time()), nx=True)
                since = float(_str(self._redis.get(EVICTION_SINCE)))
                pattern = f"{PREFIX}keys:*"
                found = [_str(k)[len(pattern) - 1 :] for k in self._redis.scan_iter(pattern, 1000)]
                names = [unquote(n) for n in found]
                if names:
                    self._redis.sadd(NAMESPACES, *names)
            self._eviction_since = since
        return self._eviction_since

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        since = self._upgraded()
        start = "-" if after is None else f"({after}"
        with self._mapped():
            found = self._redis.zrangebylex(_keys_key(namespace), start, "+", 0, limit)
            keys = [_str(k) for k in found]
            if not keys:
                return []
            # MULTI/EXEC: the three reads see one moment, never half a deletion.
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(_stats_key(namespace), keys)
            pipe.hmget(_access_key(namespace), keys)
            pipe.hmget(_hits_key(namespace), keys)
            stats, access, hits = pipe.execute()
            kept = {k: json.loads(_str(raw)) for k, raw in zip(keys, stats, strict=True) if raw}
            kept.update(self._legacy_stats(namespace, [k for k in keys if k not in kept]))
        return [
            _stats_from(namespace, key, kept[key], last, count, since)
            for key, last, count in zip(keys, access, hits, strict=True)
            if key in kept  # else deleted since the listing
        ]

    def _legacy_stats(self, namespace: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The stats fields of entries written before stats were kept, from their
        manifests; keys with no entry are left out."""
        if not keys:
            return {}
        raws = self._redis.mget([_entry_key(namespace, k) for k in keys])
        legacy = {}
        for key, raw in zip(keys, raws, strict=True):
            if raw is not None:
                stored = json.loads(_str(raw))
                facts = entry_facts(stored["manifest"])
                legacy[key] = _stats_fields(stored["created_at"], stored["writer"], facts)
        return legacy

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        since = self._upgraded()
        for start in range(0, len(touches), TOUCH_BATCH):
            batch = touches[start : start + TOUCH_BATCH]
            keys: list[str] = []
            args: list[EncodableT] = []
            for touch in batch:
                ns = touch.namespace
                keys += [_entry_key(ns, touch.key), _access_key(ns), _hits_key(ns)]
                args += [touch.key, repr(touch.at), touch.hits]
            args.append(repr(since))
            with self._mapped():
                self._touch_entries(keys=keys, args=args)

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        keys = [
            _entry_key(namespace, key),
            _keys_key(namespace),
            _stats_key(namespace),
            _access_key(namespace),
            _hits_key(namespace),
            _entry_aliases_key(namespace, key),
        ]
        args = [key, repr(created_at), _alias_key(namespace, "")]
        with self._mapped():
            return bool(self._delete_entry(keys=keys, args=args))

    def namespaces(self) -> list[str]:
        self._upgraded()
        with self._mapped():
            return sorted(_str(ns) for ns in self._redis.smembers(NAMESPACES))

    # --- records

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        where = _records_key(record.kind)
        field = _record_field(record.namespace, record.name)
        with self._mapped():
            if replacing is not None and not create_only:
                args = [field, record.value, replacing]
                return bool(self._replace_record(keys=[where], args=args))
            if create_only:
                return bool(self._redis.hsetnx(where, field, record.value))
            self._redis.hset(where, field, record.value)
            return True

    def get_record(self, kind: str, namespace: str, name: str) -> Record | None:
        with self._mapped():
            value = _opt_str(self._redis.hget(_records_key(kind), _record_field(namespace, name)))
        return None if value is None else Record(kind, namespace, name, value)

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        with self._mapped():
            return bool(self._redis.hdel(_records_key(kind), _record_field(namespace, name)))

    def records(self, kind: str, namespace: str | None = None) -> list[Record]:
        # One hash per kind: policies and pins are few (a handful per namespace).
        with self._mapped():
            found = self._redis.hgetall(_records_key(kind))
        assert isinstance(found, dict), type(found)
        records = []
        for field, value in found.items():
            ns, name = json.loads(_str(field))
            if namespace is None or ns == namespace:
                records.append(Record(kind, ns, name, _str(value)))
        return sorted(records, key=lambda r: (r.namespace, r.name))

    # --- audit log

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        args: list[EncodableT] = [keep]
        for record in records:
            args += [repr(record.at), json.dumps(_audit_fields(record), ensure_ascii=False)]
        with self._mapped():
            self._append_audit(keys=[AUDIT, AUDIT_SEQ], args=args)

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        found: list[AuditRecord] = []
        # With no namespace every record read is kept: read no more than ``limit``.
        page = AUDIT_PAGE if namespace is not None else min(limit, AUDIT_PAGE)
        cursor = _AuditCursor()
        while len(found) < limit:
            with self._mapped():
                rows = self._redis.zrevrangebyscore(
                    AUDIT, cursor.top, repr(since), cursor.skip, page, withscores=True
                )
            assert isinstance(rows, list), type(rows)
            for pair in rows:
                assert isinstance(pair, tuple), type(pair)  # withscores: (member, score)
                member, score = pair
                if not cursor.advance(_str(member), float(score)):
                    continue  # read already, or appended since the read began
                record = _audit_from(_str(member).split(" ", 1)[1])
                if namespace is None or record.namespace == namespace:
                    found.append(record)
            if len(rows) < page:
                break
        return found[:limit]

    # --- telemetry events

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        # Every call bounds every namespace of the whole append: a later call may
        # still owe an earlier one's trimming.
        bounded = sorted({e.namespace for e in events}) if max_bytes is not None else []
        more = True
        for start in range(0, len(events), EVENTS_BATCH):
            batch = events[start : start + EVENTS_BATCH]
            more = self._append_event_batch(batch, keep, before, max_bytes, bounded)
        while more:  # trimming left for later calls: each drops at most TRIM_BATCH
            more = self._append_event_batch([], keep, before, max_bytes, bounded)

    def _append_event_batch(
        self,
        events: Sequence[Event],
        keep: int,
        before: float,
        max_bytes: int | None,
        bounded: Sequence[str],
    ) -> bool:
        """Append (up to EVENTS_BATCH) events and trim, the ``bounded`` namespaces to
        ``max_bytes`` too; True when more trimming is due."""
        keys = [EVENTS, EVENTS_SEQ, EVENTS_BYTES]
        slots: dict[tuple[str, str], int] = {}
        records: list[EncodableT] = []
        for event in events:
            slot = 0
            if event.key:
                where = (event.namespace, event.key)
                if where not in slots:
                    keys.append(_events_key(*where))
                    slots[where] = len(keys)  # 1-based in Lua
                slot = slots[where]
            records += [repr(event.at), _event_text(event), slot]
        # The lists outlive the newest event of the batch by no more than its retention.
        life_ms = _ms(max((e.at for e in events), default=before) - before)
        args: list[EncodableT] = [
            keep,
            repr(before),
            EVENTS_PER_KEY,
            life_ms,
            EVENT_LISTS,
            TRIM_BATCH,
            "" if max_bytes is None else max_bytes,
            EVENTS_BY_NS,
            len(bounded),
            *bounded,
            *records,
        ]
        with self._mapped():
            return bool(self._append_events(keys=keys, args=args))

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        at, seq = events_start(since, after, limit)
        if namespaces is not None and not namespaces:
            return [], None  # of no namespace: nothing to read through the whole log
        wanted = None if namespaces is None else set(namespaces)
        # With no filter every event read is kept: read one more than the page.
        page = EVENTS_PAGE if wanted is not None else min(limit + 1, EVENTS_PAGE)
        found: list[tuple[tuple[float, int], Event]] = []
        while len(found) <= limit:
            args: list[EncodableT] = [repr(at), f"{seq:020d}", f"({until!r}", page]
            with self._mapped():
                rows = self._read_events(keys=[EVENTS], args=args)
            members = [_str(member) for member in rows]
            for member in members:
                place, event = _event_from(member)
                at, seq = place  # read: the next page starts after it
                if wanted is None or event.namespace in wanted:
                    found.append((place, event))
            if len(members) < page:
                break
        more = len(found) > limit
        found = found[:limit]
        cursor = event_cursor(*found[-1][0]) if more else None
        return [event for _, event in found], cursor

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        if limit < 1 or not key:
            return []
        with self._mapped():
            items = self._redis.lrange(_events_key(namespace, key), 0, -1)
        assert isinstance(items, list), type(items)
        # Pushed in order of appending, which replicas' clocks may not quite follow.
        found = [_event_from(_str(item)) for item in items]
        found.sort(key=lambda pair: pair[0], reverse=True)
        return [event for _, event in found[:limit]]

    def events_bytes(self, namespace: str) -> int:
        with self._mapped():
            value = self._redis.hget(EVENTS_BYTES, namespace)
        return int(_str(value)) if value is not None else 0


def _event_text(event: Event) -> str:
    # JSON has no raw newline: the body starts after the first one.
    header = json.dumps([event.namespace, event.kind, event.key], ensure_ascii=False)
    return f"{event.at!r} {header}\n{event.body}"


def _event_from(member: str) -> tuple[tuple[float, int], Event]:
    """An events-log member: its place in the log (time, sequence) and its event."""
    seq, at, rest = member.split(" ", 2)
    header, body = rest.split("\n", 1)
    namespace, kind, key = json.loads(header)
    return (float(at), int(seq)), Event(float(at), namespace, kind, key, body)


class _AuditCursor:
    """Where a newest-first read of the audit log is: pages go on from the lowest
    score read so far, skipping as many members of that score as were read (there may
    be several records of one instant). A record appended meanwhile at that score sorts
    before them (a higher sequence) and shifts them down: ``advance`` drops what it
    has read already, or was appended after the read began, by member."""

    def __init__(self) -> None:
        self._score: float | None = None
        self._member = ""  # the last member taken, of that score
        # Rows of that score read so far, taken or dropped: every row moves the next
        # page on, so that appends during a read cannot make it read one page forever.
        self._at_score = 0

    @property
    def top(self) -> str:
        return "+inf" if self._score is None else repr(self._score)

    @property
    def skip(self) -> int:
        return self._at_score

    def advance(self, member: str, score: float) -> bool:
        """Move past ``member``; False when it is not to be taken (see above)."""
        if score == self._score:
            self._at_score += 1
            if member >= self._member:
                return False
        else:
            self._score, self._at_score = score, 1
        self._member = member
        return True


def _stats_fields(created_at: float, writer: str, facts: EntryFacts) -> dict[str, Any]:
    """What neffcache:stats:{ns} holds of an entry, as JSON."""
    return {
        "created_at": created_at,
        "writer": writer,
        "size": facts.size,
        "compile_seconds": facts.compile_seconds,
        "compiler_version": facts.compiler_version,
        "model": facts.model,
        "digests": list(facts.digests),
    }


def _stats_json(entry: Entry, facts: EntryFacts) -> str:
    return json.dumps(_stats_fields(entry.created_at, entry.writer, facts), ensure_ascii=False)


def _stats_from(
    namespace: str, key: str, stored: dict[str, Any], last: object, hits: object, since: float
) -> EntryStats:
    facts = EntryFacts(
        size=stored["size"],
        compile_seconds=stored["compile_seconds"],
        compiler_version=stored["compiler_version"],
        model=stored["model"],
        digests=tuple(stored["digests"]),
    )
    created_at = stored["created_at"]
    return EntryStats(
        namespace=namespace,
        key=key,
        created_at=created_at,
        writer=stored["writer"],
        facts=facts,
        # Absent for an entry written before access times were kept.
        last_access=max(created_at, since) if last is None else float(_str(last)),
        hits=0 if hits is None else int(_str(hits)),
    )


def _audit_fields(record: AuditRecord) -> dict[str, Any]:
    return {
        "at": record.at,
        "actor": record.actor,
        "action": record.action,
        "namespace": record.namespace,
        "target": record.target,
        "detail": record.detail,
    }


def _audit_from(raw: str) -> AuditRecord:
    fields = json.loads(raw)
    return AuditRecord(
        at=fields["at"],
        actor=fields["actor"],
        action=fields["action"],
        namespace=fields["namespace"],
        target=fields["target"],
        detail=fields["detail"],
    )


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
        # Absent from tokens stored before trust existed: they are not trusted.
        trusted=fields.get("trusted") == "1",
    )
