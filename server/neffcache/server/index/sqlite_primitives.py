"""The primitives (primitives.py) in the SQLite index's file: ``SqliteCells`` in the
``cells`` table and ``SqliteLogs`` in ``log_items`` (sqlite_schema.py, version 7),
``SqliteMaps`` in ``map_fields`` (version 8).
Each write is one transaction of the index's (``Write``: BEGIN IMMEDIATE, so atomic
across the processes sharing the file)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable

from .primitives import Cell
from .sqlite_schema import real

# The index's reader (a statement and its parameters to rows) and write transaction.
Read = Callable[[str, tuple[object, ...]], list[tuple[object, ...]]]
Write = Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]


class SqliteCells:
    """``Cells`` in the index file's ``cells`` table: each operation is one statement
    (put_new, a sweep of expired cells first, in one transaction), so atomic across
    the processes sharing the file."""

    # Expired cells reclaimed per put_new at most: a write never holds the file lock
    # (which publishing shares) for an unbounded sweep.
    SWEEP = 1000

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def get(self, key: str, now: float) -> Cell | None:
        rows = self._read(
            "SELECT value, expires_at FROM cells WHERE key = ? AND expires_at > ?", (key, now)
        )
        return Cell(str(rows[0][0]), real(rows[0][1])) if rows else None

    def put_new(self, key: str, value: str, now: float, expires_at: float) -> Cell | None:
        with self._write() as conn:
            conn.execute(
                "DELETE FROM cells WHERE key IN"
                " (SELECT key FROM cells WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)",
                (now, self.SWEEP),
            )
            stored: int = conn.execute(
                "INSERT INTO cells (key, value, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                " expires_at = excluded.expires_at WHERE cells.expires_at <= ?",
                (key, value, expires_at, now),
            ).rowcount
            if stored:
                return None
            row = conn.execute("SELECT value, expires_at FROM cells WHERE key = ?", (key,))
            found, until = row.fetchone()
            return Cell(str(found), real(until))

    def swap(self, key: str, expected: str, value: str, now: float, expires_at: float) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE cells SET value = ?, expires_at = ? WHERE key = ? AND value = ?",
                (value, expires_at, key, expected),
            )
            return cursor.rowcount == 1

    def swap_head(
        self, key: str, head: str, new_head: str | None, now: float, expires_at: float
    ) -> bool:
        # substr counts characters, as len does: the head is compared whole.
        with self._write() as conn:
            if new_head is None:
                cursor = conn.execute(
                    "DELETE FROM cells WHERE key = ? AND substr(value, 1, ?) = ?",
                    (key, len(head), head),
                )
            else:
                cursor = conn.execute(
                    "UPDATE cells SET value = ? || substr(value, ?), expires_at = ?"
                    " WHERE key = ? AND substr(value, 1, ?) = ?",
                    (new_head, len(head) + 1, expires_at, key, len(head), head),
                )
            return cursor.rowcount == 1


class SqliteLogs:
    """``Logs`` in the index file's ``log_items`` table; each add is one transaction."""

    # Expired items reclaimed per add at most, as for cells.
    SWEEP = 1000

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def add(self, log: str, item: str, score: float, keep: int, now: float) -> None:
        with self._write() as conn:
            conn.execute(
                "DELETE FROM log_items WHERE (log, item) IN (SELECT log, item FROM log_items"
                " WHERE score <= ? ORDER BY score LIMIT ?)",
                (now, self.SWEEP),
            )
            conn.execute(
                "INSERT OR REPLACE INTO log_items (log, item, score) VALUES (?, ?, ?)",
                (log, item, score),
            )
            conn.execute(
                "DELETE FROM log_items WHERE log = ? AND (score <= ? OR item NOT IN"
                " (SELECT item FROM log_items WHERE log = ? ORDER BY score DESC LIMIT ?))",
                (log, now, log, keep),
            )

    def read(self, log: str, now: float) -> list[tuple[str, float]]:
        rows = self._read(
            "SELECT item, score FROM log_items WHERE log = ? AND score > ?", (log, now)
        )
        return [(str(item), real(score)) for item, score in rows]


class SqliteMaps:
    """``Maps`` in the index file's ``map_fields`` table, whose primary key (map,
    field) serves every call; each write is one statement."""

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def get(self, name: str, field: str) -> str | None:
        rows = self._read("SELECT value FROM map_fields WHERE map = ? AND field = ?", (name, field))
        return str(rows[0][0]) if rows else None

    def put_new(self, name: str, field: str, value: str) -> bool:
        return self._changed(
            "INSERT INTO map_fields (map, field, value) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (name, field, value),
        )

    def swap(self, name: str, field: str, expected: str, value: str) -> bool:
        return self._changed(
            "UPDATE map_fields SET value = ? WHERE map = ? AND field = ? AND value = ?",
            (value, name, field, expected),
        )

    def delete_if(self, name: str, field: str, expected: str) -> bool:
        return self._changed(
            "DELETE FROM map_fields WHERE map = ? AND field = ? AND value = ?",
            (name, field, expected),
        )

    def items(self, name: str) -> dict[str, str]:
        rows = self._read("SELECT field, value FROM map_fields WHERE map = ?", (name,))
        return {str(field): str(value) for field, value in rows}

    def _changed(self, sql: str, params: tuple[object, ...]) -> bool:
        with self._write() as conn:
            return conn.execute(sql, params).rowcount == 1
