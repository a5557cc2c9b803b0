"""``Sequences`` (sequences.py) in the SQLite index's file: every log's items in the
``sequence_items`` table, the rowid (``id``) their sequence, with indexes by time, by
group and by tag, each closed by the rowid so ties keep the order of appending; each
log's row count in ``sequence_counts`` and each group's bytes in ``sequence_bytes``,
kept by triggers (sqlite_schema.py, version 9). Each append is one transaction.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Sequence

from .sequences import Item, Place, Placed, Trim
from .sqlite_primitives import Read, Write
from .sqlite_schema import real

_COLUMNS = "id, at, grp, tag, head, body"
# Rows after ``after`` and before ``until``; ids are >= 1, so (since, 0) takes all of since.
_AFTER = "at < ? AND (at > ? OR (at = ? AND id > ?))"
# Rows of a group read per round while finding how many of its oldest to drop.
_TRIM_ROWS = 256


class SqliteSequences:
    """``Sequences`` over the index's reader and write transaction."""

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def append(self, log: str, items: Sequence[Item], trim: Trim) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO sequence_items (log, at, grp, tag, head, body)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(log, i.at, i.group, i.tag, i.head, i.body) for i in items],
            )
            found = conn.execute("SELECT n FROM sequence_counts WHERE log = ?", (log,))
            count = (_int(row[0]) if (row := found.fetchone()) else 0) + len(items)
            # Both deletes walk sequence_items_by_time from the oldest: they cost what
            # they drop.
            count -= conn.execute(
                "DELETE FROM sequence_items WHERE log = ? AND at < ?", (log, trim.before)
            ).rowcount
            if count > trim.keep:
                count -= conn.execute(
                    "DELETE FROM sequence_items WHERE id IN (SELECT id FROM sequence_items"
                    " WHERE log = ? ORDER BY at, id LIMIT ?)",
                    (log, count - max(trim.keep, 0)),
                ).rowcount
            if trim.max_bytes is not None:
                for group in sorted({i.group for i in items}):
                    count -= _trim_group(conn, log, group, trim.max_bytes)
            conn.execute(
                "INSERT INTO sequence_counts (log, n) VALUES (?, ?)"
                " ON CONFLICT (log) DO UPDATE SET n = excluded.n",
                (log, max(count, 0)),
            )

    def read(
        self, log: str, after: Place, until: float, groups: Sequence[str] | None, limit: int
    ) -> list[Placed]:
        params: tuple[object, ...] = (until, after[0], after[0], after[1])
        if groups is not None:
            return self._read_groups(log, sorted(set(groups)), params, limit)
        rows = self._read(
            f"SELECT {_COLUMNS} FROM sequence_items WHERE log = ? AND {_AFTER}"
            " ORDER BY at, id LIMIT ?",
            (log, *params, limit),
        )
        return [_placed(row) for row in rows]

    def _read_groups(
        self, log: str, groups: list[str], params: tuple[object, ...], limit: int
    ) -> list[Placed]:
        """The first ``limit`` items of some groups: one range scan of
        sequence_items_by_group per group, each already in place order, merged here
        (an IN list would sort every matching row). Once ``limit`` items are in hand,
        the last of them bounds the later scans: an item past it cannot be among the
        first. Without the bound every page would read ``limit`` rows of each group,
        most of them to be read again for the next page."""
        found: list[Placed] = []
        upper = ""
        bound: tuple[object, ...] = ()
        for group in groups:
            rows = self._read(
                f"SELECT {_COLUMNS} FROM sequence_items WHERE log = ? AND grp = ?"
                f" AND {_AFTER}{upper} ORDER BY at, id LIMIT ?",
                (log, group, *params, *bound, limit),
            )
            merged = heapq.merge(found, map(_placed, rows), key=_place)
            found = list(merged)[:limit]
            if len(found) == limit:
                last_at, last_id = found[-1].place
                upper = " AND (at < ? OR (at = ? AND id <= ?))"
                bound = (last_at, last_at, last_id)
        return found

    def newest(
        self, log: str, group: str | None, tag: str | None, since: float, limit: int
    ) -> list[Placed]:
        # LIMIT -1 would mean no limit.
        if limit < 1:
            return []
        where, params = "log = ?", [log]
        if group is not None:
            where, params = where + " AND grp = ?", [*params, group]
            if tag is not None:
                where, params = where + " AND tag = ?", [*params, tag]
        rows = self._read(
            f"SELECT {_COLUMNS} FROM sequence_items WHERE {where} AND at >= ?"
            " ORDER BY at DESC, id DESC LIMIT ?",
            (*params, since, limit),
        )
        return [_placed(row) for row in rows]

    def group_bytes(self, log: str, group: str) -> int:
        rows = self._read(
            "SELECT bytes FROM sequence_bytes WHERE log = ? AND grp = ?", (log, group)
        )
        return _int(rows[0][0]) if rows else 0


def _trim_group(conn: sqlite3.Connection, log: str, group: str, max_bytes: int) -> int:
    """Drop the oldest items of ``group`` until its bytes are at most ``max_bytes``;
    the number dropped. Reads its oldest rows through sequence_items_by_group only as
    far as the excess reaches, then drops them in one range delete: it costs what it
    drops."""
    found = conn.execute(
        "SELECT bytes FROM sequence_bytes WHERE log = ? AND grp = ?", (log, group)
    ).fetchone()
    excess = (_int(found[0]) if found else 0) - max_bytes
    if excess <= 0:
        return 0
    oldest = conn.execute(
        "SELECT at, id, length(CAST(body AS BLOB)) FROM sequence_items"
        " WHERE log = ? AND grp = ? ORDER BY at, id",
        (log, group),
    )
    last: tuple[object, ...] | None = None
    try:
        while excess > 0 and (rows := oldest.fetchmany(_TRIM_ROWS)):
            for last in rows:
                excess -= _int(last[2])
                if excess <= 0:
                    break
    finally:
        oldest.close()  # unfinished: the delete below changes what it reads
    if last is None:
        return 0
    at, item_id = last[0], last[1]
    deleted: int = conn.execute(
        "DELETE FROM sequence_items WHERE log = ? AND grp = ? AND (at < ? OR (at = ? AND id <= ?))",
        (log, group, at, at, item_id),
    ).rowcount
    return deleted


def _placed(row: tuple[object, ...]) -> Placed:
    item_id, at, group, tag, head, body = row
    assert isinstance(item_id, int), item_id  # INTEGER PRIMARY KEY
    return Placed((real(at), item_id), Item(real(at), str(group), str(tag), str(head), str(body)))


def _place(placed: Placed) -> Place:
    return placed.place


def _int(value: object) -> int:
    assert isinstance(value, int), value  # a byte count or a row count
    return value
