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

Every role is written once over the primitives (primitive_roles.py over
redis_primitives.py, redis_sequences.py and redis_catalogs.py): entries and aliases
are one catalog per namespace, in the keys earlier servers kept them in (an entry's
key is the truth: its stats, access time and hits live beside it, written and deleted
with it); a lease is one cell, a key with Redis's own expiry, so its life is measured
on one clock however many replicas ask; a key's failure records are one log, a
sorted set that expires with its longest-lived record, so Redis itself reclaims keys
nobody writes again; tokens are one map (a hash), and the records of a kind another,
as earlier servers kept them; the events one sequence, in the keys earlier servers
kept them in, and the audit log another, moved there once (redis_upgrade.py). This
module holds the connection, its errors and those moves.

Times pass through Lua as Python reprs and are compared with ``tonumber``: both parse
to the same double, so equality is exact, and a time is written back as the string it
came as, never as Lua formats a number (14 digits).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError

from .audit import SequenceAudit
from .primitive_roles import PrimitiveRoles
from .redis_catalogs import RedisCatalogs
from .redis_primitives import RedisCells, RedisLogs, RedisMaps
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

# Events kept per (namespace, key) for events_for_key (docs/telemetry.md): the events
# log's tag lists.
EVENTS_PER_KEY = PER_TAG


class RedisIndex(PrimitiveRoles):
    """An index in a Redis database.

    >>> index = RedisIndex.from_url("redis://redis.internal:6379/0")
    >>> index.check()  # raises StoreError within seconds if Redis is down
    """

    def __init__(self, client: redis.Redis, *, where: str = "redis") -> None:
        """``client`` must decode responses; ``where`` names it in errors (no secrets)."""
        self._redis = client
        self._where = where
        # Every role written once over primitives.
        super().__init__(
            RedisCells(client, self._mapped),
            RedisLogs(client, self._mapped),
            RedisMaps(client, self._mapped),
            RedisSequences(client, self._mapped),
            RedisCatalogs(client, self._mapped),
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

    def tokens_ready(self) -> MapTokens:
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


def _redacted(url: str) -> str:
    """host:port/db, without the credentials a URL may carry."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
