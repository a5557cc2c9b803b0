"""A Redis index, ``redis://host:port/db``: shared by every server replica.

Every key starts with ``neffcache:``::

    neffcache:entry:{ns}:{key}          JSON {"manifest", "created_at", "writer"}
    neffcache:alias:{ns}:{alias}        the key the alias names
    neffcache:keys:{ns}                 sorted set of the namespace's entry keys, every
                                        score 0, so ZRANGEBYLEX lists them in key order
    neffcache:token-records             hash: secret_hash -> JSON of the Token's
                                        other fields
    neffcache:tokens                    "moved to neffcache:token-records": where the
                                        sorted set of earlier servers' tokens went
                                        (redis_upgrade.py)
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
    neffcache:audit                     "moved to neffcache:audit-log": where the
                                        sorted set of earlier servers' audit records
                                        went (redis_upgrade.py)
    neffcache:{log}                     a sequence (redis_sequences.py): sorted set
                                        of its items, scored by ``at``; each member is
                                        "<seq, 20 digits> <at> <JSON [group, head,
                                        tag]>\n<body>"
    neffcache:{log}-seq                 the last seq handed out
    neffcache:{log}:{group}:{tag}       list of the tag's newest items (their members
                                        in neffcache:{log}), the latest pushed first;
                                        expires a retention after its last write
    neffcache:{log}-ns:{group}          sorted set of the group's items, scored by
                                        ``at``; each member is "<seq, 20 digits> <body
                                        bytes>", so its oldest are found without
                                        walking the log
    neffcache:{log}-bytes               hash: group -> the body bytes of its items
                                        that have a member in its sorted set

The audit log is the sequence ``audit-log`` (audit.py), grouped by namespace, the
action as the head. The telemetry events are the sequence ``events`` (events.py),
grouped by namespace and tagged by key, the kind as the head: ``neffcache:events``,
``neffcache:events-seq``, ``neffcache:events:{ns}:{key}``,
``neffcache:events-ns:{ns}`` and ``neffcache:events-bytes``, the keys earlier servers
kept them in.

``put_entry``, ``add_alias``, ``delete_entry``, ``touch_entries`` (per batch) and a
sequence's append (per batch) each run as one Lua script, so they are atomic across
replicas. The scripts touch several keys, some of them named inside the script (the
aliases an entry loses, the entry an alias names, the lists and group sets of the
items an append drops), which a standalone Redis (or one primary) allows and Redis
Cluster does not. The scripts are in redis_scripts.py.

Leases, failure records, tokens, records, the audit log and the events are written
once over the primitives (primitive_roles.py over redis_primitives.py and
redis_sequences.py): a lease is one cell, a key with Redis's own expiry, so its life
is measured on one clock however many replicas ask; a key's failure records are one
log, a sorted set that expires with its longest-lived record, so Redis itself
reclaims keys nobody writes again; tokens are one map (a hash), and the records of a
kind another, as earlier servers kept them; the events one sequence, in the keys
earlier servers kept them in, and the audit log another, moved there once
(redis_upgrade.py).

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
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.typing import EncodableT

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError

from .audit import SequenceAudit
from .base import (
    Entry,
    EntryFacts,
    EntryStats,
    PutResult,
    Touch,
    entry_facts,
)
from .primitive_roles import PrimitiveRoles
from .redis_primitives import PREFIX, RedisCells, RedisLogs, RedisMaps, as_str, escaped
from .redis_scripts import (
    ADD_ALIAS,
    DELETE_ENTRY,
    PUT_ENTRY,
    TOUCH_ENTRIES,
)
from .redis_sequences import PER_TAG, RedisSequences
from .redis_sequences import TRIM_BATCH as TRIM_BATCH  # a documented bound, named here
from .redis_upgrade import move_old_audit, move_old_tokens
from .tokens import MapTokens

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

NAMESPACES = PREFIX + "namespaces"
# When this database first held eviction data (set once): an entry written before has no
# access time, and counts as last served then, not when it was created, so an upgrade
# does not expire every old entry however much it is used.
EVICTION_SINCE = PREFIX + "eviction-since"

# Events kept per (namespace, key) for events_for_key (docs/telemetry.md): the events
# log's tag lists.
EVENTS_PER_KEY = PER_TAG
# Touches per script call: each call holds Redis for its whole batch.
TOUCH_BATCH = 500


def _entry_key(namespace: str, key: str) -> str:
    return f"{PREFIX}entry:{escaped(namespace)}:{key}"


def _keys_key(namespace: str) -> str:
    return f"{PREFIX}keys:{escaped(namespace)}"


def _alias_key(namespace: str, alias: str) -> str:
    return f"{PREFIX}alias:{escaped(namespace)}:{alias}"


def _stats_key(namespace: str) -> str:
    return f"{PREFIX}stats:{escaped(namespace)}"


def _access_key(namespace: str) -> str:
    return f"{PREFIX}access:{escaped(namespace)}"


def _hits_key(namespace: str) -> str:
    return f"{PREFIX}hits:{escaped(namespace)}"


def _entry_aliases_key(namespace: str, key: str) -> str:
    return f"{PREFIX}entry-aliases:{escaped(namespace)}:{key}"


class RedisIndex(PrimitiveRoles):
    """An index in a Redis database.

    >>> index = RedisIndex.from_url("redis://redis.internal:6379/0")
    >>> index.check()  # raises StoreError within seconds if Redis is down
    """

    def __init__(self, client: redis.Redis, *, where: str = "redis") -> None:
        """``client`` must decode responses; ``where`` names it in errors (no secrets)."""
        self._redis = client
        self._where = where
        self._eviction_since: float | None = None
        self._put_entry = client.register_script(PUT_ENTRY)
        self._add_alias = client.register_script(ADD_ALIAS)
        self._delete_entry = client.register_script(DELETE_ENTRY)
        self._touch_entries = client.register_script(TOUCH_ENTRIES)
        # Leases, failures, tokens, records, audit, events: written once over primitives.
        super().__init__(
            RedisCells(client, self._mapped),
            RedisLogs(client, self._mapped),
            RedisMaps(client, self._mapped),
            RedisSequences(client, self._mapped),
        )
        self._tokens_moved = False
        self._audit_moved = False

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
                as_str(a) for a in self._redis.smembers(_entry_aliases_key(namespace, key))
            )
            named = self._redis.mget([_alias_key(namespace, a) for a in members]) if members else []
        # Checked against each alias itself: the set is delete_entry's bookkeeping,
        # the alias's own key is what a lookup follows.
        return [a for a, k in zip(members, named, strict=True) if _opt_str(k) == key]

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        keys = [_entry_key(namespace, key), _alias_key(namespace, alias)]
        args = [key, alias, _entry_key(namespace, ""), _entry_aliases_key(namespace, "")]
        with self._mapped():
            result = as_str(self._add_alias(keys=keys, args=args))
        return None if result == "absent" else PutResult(result)

    def _tokens_ready(self) -> MapTokens:
        # Once per process: tokens an earlier server stored move into the map first.
        if not self._tokens_moved:
            with self._mapped():
                move_old_tokens(self._redis)
            self._tokens_moved = True
        return self._tokens

    def _audit_ready(self) -> SequenceAudit:
        # Once per process: records an earlier server stored move into the sequence first.
        if not self._audit_moved:
            with self._mapped():
                move_old_audit(self._redis)
            self._audit_moved = True
        return self._audit

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
            keys = [as_str(k) for k in found]
            raws = self._redis.mget([_entry_key(namespace, k) for k in keys]) if keys else []
        entries = []
        for key, raw in zip(keys, raws, strict=True):
            if raw is None:  # deleted since the listing
                continue
            stored = json.loads(as_str(raw))
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
                since = float(as_str(self._redis.get(EVICTION_SINCE)))
                pattern = f"{PREFIX}keys:*"
                found = [
                    as_str(k)[len(pattern) - 1 :] for k in self._redis.scan_iter(pattern, 1000)
                ]
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
            keys = [as_str(k) for k in found]
            if not keys:
                return []
            # MULTI/EXEC: the three reads see one moment, never half a deletion.
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(_stats_key(namespace), keys)
            pipe.hmget(_access_key(namespace), keys)
            pipe.hmget(_hits_key(namespace), keys)
            stats, access, hits = pipe.execute()
            kept = {k: json.loads(as_str(raw)) for k, raw in zip(keys, stats, strict=True) if raw}
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
                stored = json.loads(as_str(raw))
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
            return sorted(as_str(ns) for ns in self._redis.smembers(NAMESPACES))


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
        last_access=max(created_at, since) if last is None else float(as_str(last)),
        hits=0 if hits is None else int(as_str(hits)),
    )


def _redacted(url: str) -> str:
    """host:port/db, without the credentials a URL may carry."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"


def _opt_str(value: object) -> str | None:
    return None if value is None else as_str(value)
