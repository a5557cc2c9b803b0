"""``Catalogs`` (catalogs.py) in the SQLite index's file, in the tables earlier
servers kept entries in (sqlite_schema.py): a row and its facts and use are one row
of ``entries`` (primary key (namespace, key), which serves lookups, paging and the
list of namespaces), a name one row of ``aliases`` (``aliases_by_key`` finds a key's).
Each write is one transaction of the index's (``Write``: BEGIN IMMEDIATE, so atomic
across the processes sharing the file); each read one statement."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .base import Entry, EntryFacts, EntryStats, Touch
from .sqlite_primitives import Read, Write
from .sqlite_schema import FACT_COLUMNS, fact_values, real

_STATS_COLUMNS = f"key, created_at, writer, {FACT_COLUMNS}, last_access, hits"
# A name that names a key with no row (deleted) is free: it takes the new key. When
# it names this key, or another live row, it stays: rowcount 0.
_UPSERT_NAME = (
    "INSERT INTO aliases (namespace, alias, key) VALUES (?, ?, ?)"
    " ON CONFLICT (namespace, alias) DO UPDATE SET key = excluded.key"
    " WHERE NOT EXISTS"
    " (SELECT 1 FROM entries WHERE namespace = aliases.namespace AND key = aliases.key)"
)


class SqliteCatalogs:
    """``Catalogs`` in the ``entries`` and ``aliases`` tables."""

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def put_new(self, row: Entry, facts: EntryFacts, names: Sequence[str]) -> Entry | None:
        with self._write() as conn:
            inserted = conn.execute(
                "INSERT INTO entries (namespace, key, manifest, created_at, writer,"
                f" {FACT_COLUMNS}, last_access, hits)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT DO NOTHING",
                (
                    row.namespace,
                    row.key,
                    row.manifest,
                    row.created_at,
                    row.writer,
                    *fact_values(facts),
                    row.created_at,
                ),
            ).rowcount
            if inserted:
                conn.executemany(_UPSERT_NAME, [(row.namespace, n, row.key) for n in names])
                return None
            manifest, created_at, writer = conn.execute(
                "SELECT manifest, created_at, writer FROM entries WHERE namespace = ? AND key = ?",
                (row.namespace, row.key),
            ).fetchone()
        return Entry(row.namespace, row.key, str(manifest), real(created_at), str(writer))

    def get(self, catalog: str, key: str) -> Entry | None:
        rows = self._read(
            "SELECT manifest, created_at, writer FROM entries WHERE namespace = ? AND key = ?",
            (catalog, key),
        )
        if not rows:
            return None
        manifest, created_at, writer = rows[0]
        return Entry(catalog, key, str(manifest), real(created_at), str(writer))

    def resolve(self, catalog: str, name: str) -> str | None:
        rows = self._read(
            "SELECT key FROM aliases WHERE namespace = ? AND alias = ?", (catalog, name)
        )
        return str(rows[0][0]) if rows else None

    def names_of(self, catalog: str, key: str) -> list[str]:
        rows = self._read(  # aliases_by_key serves it
            "SELECT alias FROM aliases WHERE namespace = ? AND key = ? ORDER BY alias",
            (catalog, key),
        )
        return [str(row[0]) for row in rows]

    def claim(self, catalog: str, name: str, key: str) -> tuple[bool, str] | None:
        with self._write() as conn:
            found = conn.execute(
                "SELECT 1 FROM entries WHERE namespace = ? AND key = ?", (catalog, key)
            ).fetchone()
            if found is None:
                return None
            if conn.execute(_UPSERT_NAME, (catalog, name, key)).rowcount:
                return True, key
            (named,) = conn.execute(
                "SELECT key FROM aliases WHERE namespace = ? AND alias = ?", (catalog, name)
            ).fetchone()
            return False, str(named)

    def rows(self, catalog: str, after: str | None, limit: int) -> list[Entry]:
        # The primary key (namespace, key) serves both the range and the order.
        rows = self._read(
            "SELECT key, manifest, created_at, writer FROM entries"
            " WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (catalog, after or "", limit),
        )
        return [
            Entry(catalog, str(key), str(manifest), real(created_at), str(writer))
            for key, manifest, created_at, writer in rows
        ]

    def stats(self, catalog: str, after: str | None, limit: int) -> list[EntryStats]:
        rows = self._read(
            f"SELECT {_STATS_COLUMNS} FROM entries"
            " WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (catalog, after or "", limit),
        )
        return [_stats(catalog, row) for row in rows]

    def touch(self, touches: Sequence[Touch]) -> None:
        if not touches:
            return
        # One transaction for the batch: one fsync and one wait for the write lock
        # instead of one per touch. An UPDATE of an absent row matches nothing.
        with self._write() as conn:
            conn.executemany(
                "UPDATE entries SET last_access = MAX(last_access, ?), hits = hits + ?"
                " WHERE namespace = ? AND key = ?",
                [(t.at, t.hits, t.namespace, t.key) for t in touches],
            )

    def delete_if(self, catalog: str, key: str, created_at: float) -> bool:
        with self._write() as conn:
            # REAL holds the double that was written, so equality is exact.
            deleted = conn.execute(
                "DELETE FROM entries WHERE namespace = ? AND key = ? AND created_at = ?",
                (catalog, key, created_at),
            ).rowcount
            if deleted:
                conn.execute("DELETE FROM aliases WHERE namespace = ? AND key = ?", (catalog, key))
            return deleted == 1

    def catalogs(self) -> list[str]:
        # DISTINCT over the primary key's leading column: an index scan, no sort.
        rows = self._read("SELECT DISTINCT namespace FROM entries ORDER BY namespace", ())
        return [str(namespace) for (namespace,) in rows]


def _stats(catalog: str, row: tuple[object, ...]) -> EntryStats:
    key, created_at, writer, size, seconds, version, model, digests, last_access, hits = row
    assert isinstance(size, int), size  # INTEGER NOT NULL
    assert isinstance(hits, int), hits  # INTEGER NOT NULL
    facts = EntryFacts(
        size=size,
        compile_seconds=None if seconds is None else real(seconds),
        compiler_version=str(version),
        model=str(model),
        digests=tuple(json.loads(str(digests))),
    )
    return EntryStats(
        namespace=catalog,
        key=str(key),
        created_at=real(created_at),
        writer=str(writer),
        facts=facts,
        last_access=real(last_access),
        hits=hits,
    )
