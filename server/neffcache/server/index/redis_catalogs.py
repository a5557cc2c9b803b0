"""``Catalogs`` (catalogs.py) in Redis, in the keys earlier servers kept entries in
(redis.py lists them): a row is the string ``neffcache:entry:{ns}:{key}`` (JSON of
its manifest, created_at and writer), listed in the sorted set ``neffcache:keys:{ns}``
(every score 0, so ZRANGEBYLEX pages it in key order); its facts, access time and
hits are fields of the namespace's hashes ``stats``, ``access`` and ``hits``; a name
is the string ``neffcache:alias:{ns}:{name}``, and each key's names a set beside it.

A lookup is one GET; ``put_new``, ``claim``, ``delete_if`` and ``touch`` are one Lua
script each (redis_scripts.py), so atomic across replicas. The row's key is the
truth: a row is there when its key is. A row written before stats were kept reads
with its facts computed from its manifest, ``last_access`` the later of
``created_at`` and when this database first held eviction data, and no hits.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote

import redis
from redis.typing import EncodableT

from .base import Entry, EntryFacts, EntryStats, Touch, entry_facts
from .redis_primitives import PREFIX, as_str, escaped
from .redis_scripts import ADD_ALIAS, DELETE_ENTRY, PUT_ENTRY, TOUCH_ENTRIES

NAMESPACES = PREFIX + "namespaces"
# When this database first held eviction data (set once): an entry written before has no
# access time, and counts as last served then, not when it was created, so an upgrade
# does not expire every old entry however much it is used.
EVICTION_SINCE = PREFIX + "eviction-since"


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


class RedisCatalogs:
    """``Catalogs`` in the entry keys, their listing and stats hashes, and the names."""

    def __init__(
        self, client: redis.Redis, mapped: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        self._redis = client
        self._mapped = mapped
        self._eviction_since: float | None = None
        self._put_new = client.register_script(PUT_ENTRY)
        self._claim = client.register_script(ADD_ALIAS)
        self._delete_if = client.register_script(DELETE_ENTRY)
        self._touch = client.register_script(TOUCH_ENTRIES)

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        ns = row.namespace
        stored = {"manifest": row.manifest, "created_at": row.created_at, "writer": row.writer}
        keys = [
            _entry_key(ns, row.key),
            _keys_key(ns),
            _stats_key(ns),
            _access_key(ns),
            _hits_key(ns),
            NAMESPACES,
        ]
        keys += [_alias_key(ns, name) for name in names]
        # ensure_ascii=False: the same UTF-8 bytes as the manifest, no \\u escapes.
        args = [
            json.dumps(stored, ensure_ascii=False),
            row.key,
            json.dumps(_stats_fields(row.created_at, row.writer, facts), ensure_ascii=False),
            repr(row.created_at),
            ns,
            _entry_key(ns, ""),
            _entry_aliases_key(ns, ""),
            *names,
        ]
        with self._mapped():
            held = self._put_new(keys=keys, args=args)
        return None if held is None else _entry(ns, row.key, as_str(held))

    def get(self, catalog: str, key: str) -> Entry | None:
        with self._mapped():
            raw = self._redis.get(_entry_key(catalog, key))
        return None if raw is None else _entry(catalog, key, as_str(raw))

    def resolve(self, catalog: str, name: str) -> str | None:
        with self._mapped():
            named = self._redis.get(_alias_key(catalog, name))
        return None if named is None else as_str(named)

    def names_of(self, catalog: str, key: str) -> list[str]:
        with self._mapped():
            members = sorted(
                as_str(a) for a in self._redis.smembers(_entry_aliases_key(catalog, key))
            )
            named = self._redis.mget([_alias_key(catalog, a) for a in members]) if members else []
        # Checked against each name itself: the set is delete_if's bookkeeping, the
        # name's own key is what a lookup follows.
        return [
            a for a, k in zip(members, named, strict=True) if k is not None and as_str(k) == key
        ]

    def claim(self, catalog: str, name: str, key: str) -> tuple[bool, str] | None:
        keys = [_entry_key(catalog, key), _alias_key(catalog, name)]
        args = [key, name, _entry_key(catalog, ""), _entry_aliases_key(catalog, "")]
        with self._mapped():
            result = self._claim(keys=keys, args=args)
        if result is None:
            return None
        written, named = result
        return bool(written), as_str(named)

    def rows(self, catalog: str, after: str | None, limit: int) -> list[Entry]:
        with self._mapped():
            keys = self._keys(catalog, after, limit)
            raws = self._redis.mget([_entry_key(catalog, k) for k in keys]) if keys else []
        # A key whose row is gone was deleted since the listing.
        return [_entry(catalog, k, as_str(raw)) for k, raw in zip(keys, raws, strict=True) if raw]

    def _keys(self, catalog: str, after: str | None, limit: int) -> list[str]:
        # "(" excludes ``after`` itself; "-" is the lowest member.
        start = "-" if after is None else f"({after}"
        found = self._redis.zrangebylex(_keys_key(catalog), start, "+", 0, limit)
        return [as_str(k) for k in found]

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

    def stats(self, catalog: str, after: str | None, limit: int) -> list[EntryStats]:
        since = self._upgraded()
        with self._mapped():
            keys = self._keys(catalog, after, limit)
            if not keys:
                return []
            # MULTI/EXEC: the three reads see one moment, never half a deletion.
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(_stats_key(catalog), keys)
            pipe.hmget(_access_key(catalog), keys)
            pipe.hmget(_hits_key(catalog), keys)
            stats, access, hits = pipe.execute()
            kept = {k: json.loads(as_str(raw)) for k, raw in zip(keys, stats, strict=True) if raw}
            kept.update(self._legacy_stats(catalog, [k for k in keys if k not in kept]))
        return [
            _stats_from(catalog, key, kept[key], last, count, since)
            for key, last, count in zip(keys, access, hits, strict=True)
            if key in kept  # else deleted since the listing
        ]

    def _legacy_stats(self, catalog: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The stats fields of rows written before stats were kept, from their
        manifests; keys with no row are left out."""
        if not keys:
            return {}
        raws = self._redis.mget([_entry_key(catalog, k) for k in keys])
        legacy = {}
        for key, raw in zip(keys, raws, strict=True):
            if raw is not None:
                stored = json.loads(as_str(raw))
                facts = entry_facts(stored["manifest"])
                legacy[key] = _stats_fields(stored["created_at"], stored["writer"], facts)
        return legacy

    def touch(self, touches: Sequence[Touch]) -> None:
        if not touches:
            return
        since = self._upgraded()
        keys: list[str] = []
        args: list[EncodableT] = []
        for touch in touches:
            ns = touch.namespace
            keys += [_entry_key(ns, touch.key), _access_key(ns), _hits_key(ns)]
            args += [touch.key, repr(touch.at), touch.hits]
        args.append(repr(since))
        with self._mapped():
            self._touch(keys=keys, args=args)

    def delete_if(self, catalog: str, key: str, created_at: float) -> bool:
        keys = [
            _entry_key(catalog, key),
            _keys_key(catalog),
            _stats_key(catalog),
            _access_key(catalog),
            _hits_key(catalog),
            _entry_aliases_key(catalog, key),
        ]
        args = [key, repr(created_at), _alias_key(catalog, "")]
        with self._mapped():
            return bool(self._delete_if(keys=keys, args=args))

    def catalogs(self) -> list[str]:
        self._upgraded()
        with self._mapped():
            return sorted(as_str(ns) for ns in self._redis.smembers(NAMESPACES))


def _entry(namespace: str, key: str, raw: str) -> Entry:
    stored = json.loads(raw)
    return Entry(namespace, key, stored["manifest"], stored["created_at"], stored["writer"])


def _stats_fields(created_at: float, writer: str, facts: EntryFacts) -> dict[str, Any]:
    """What neffcache:stats:{ns} holds of a row, as JSON."""
    return {
        "created_at": created_at,
        "writer": writer,
        "size": facts.size,
        "compile_seconds": facts.compile_seconds,
        "compiler_version": facts.compiler_version,
        "model": facts.model,
        "digests": list(facts.digests),
    }


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
