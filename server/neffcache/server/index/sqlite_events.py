"""The events log in the SQLite index's file (``EventLog``, for sqlite.py): the
``events`` table, its indexes by time, by namespace and by key, the row count in
``events_count`` and each namespace's bytes in ``events_bytes``, kept by triggers
(sqlite_schema.py, versions 5 and 6).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Sequence

from .base import Event, event_cursor, events_start
from .sqlite_primitives import Read, Write
from .sqlite_schema import real

_EVENT_COLUMNS = "id, at, namespace, kind, key, body"


class SqliteEvents:
    """The ``EventLog`` role over the index's reader and write transaction."""

    def __init__(self, read: Read, write: Write) -> None:
        self._read = read
        self._write = write

    def append_events(
        self, events: Sequence[Event], keep: int, before: float, max_bytes: int | None = None
    ) -> None:
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO events (at, namespace, kind, key, body) VALUES (?, ?, ?, ?, ?)",
                [(e.at, e.namespace, e.kind, e.key, e.body) for e in events],
            )
            (count,) = conn.execute("SELECT n FROM events_count").fetchone()
            count += len(events)
            # Both deletes walk events_by_time from the oldest: they cost what they drop.
            count -= conn.execute("DELETE FROM events WHERE at < ?", (before,)).rowcount
            if count > keep:
                count -= conn.execute(
                    "DELETE FROM events WHERE id IN"
                    " (SELECT id FROM events ORDER BY at, id LIMIT ?)",
                    (count - max(keep, 0),),
                ).rowcount
            if max_bytes is not None:
                for namespace in sorted({e.namespace for e in events}):
                    count -= _trim_namespace(conn, namespace, max_bytes)
            conn.execute("UPDATE events_count SET n = ?", (max(count, 0),))

    def events(
        self,
        since: float,
        until: float,
        namespaces: Sequence[str] | None,
        after: str | None,
        limit: int,
    ) -> tuple[list[Event], str | None]:
        # Rows come after (at, id) = start; ids are >= 1, so (since, 0) takes all of since.
        start = events_start(since, after, limit)
        where = "at < ? AND (at > ? OR (at = ? AND id > ?))"
        params: tuple[object, ...] = (until, start[0], start[0], start[1], limit + 1)
        if namespaces is None:
            rows = self._read(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {where} ORDER BY at, id LIMIT ?",
                params,
            )
        else:
            rows = self._events_of(sorted(set(namespaces)), where, params, limit)
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = event_cursor(*_row_place(rows[-1])) if more else None
        return [_event(row) for row in rows], cursor

    def _events_of(
        self, namespaces: list[str], where: str, params: tuple[object, ...], limit: int
    ) -> list[tuple[object, ...]]:
        """The first ``limit + 1`` rows of some namespaces: one range scan of
        events_by_namespace per namespace, each already in (at, id) order, merged here
        (an IN list would sort every matching row). Once ``limit + 1`` rows are in
        hand, the last of them bounds the later scans: a row past it cannot be among
        the first. Without the bound every page would read ``limit + 1`` rows of each
        namespace, most of them to be read again for the next page."""
        rows: list[tuple[object, ...]] = []
        upper = ""
        bound: tuple[object, ...] = ()
        for namespace in namespaces:
            found = self._read(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE namespace = ? AND {where}{upper}"
                " ORDER BY at, id LIMIT ?",
                (namespace, *params[:-1], *bound, params[-1]),
            )
            rows = list(heapq.merge(rows, found, key=_row_place))[: limit + 1]
            if len(rows) > limit:
                last_at, last_id = _row_place(rows[-1])
                upper = " AND (at < ? OR (at = ? AND id <= ?))"
                bound = (last_at, last_at, last_id)
        return rows

    def events_for_key(self, namespace: str, key: str, limit: int) -> list[Event]:
        # Events without a key belong to none; and LIMIT -1 would mean no limit.
        if not key or limit < 1:
            return []
        rows = self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE namespace = ? AND key = ?"
            " ORDER BY at DESC, id DESC LIMIT ?",
            (namespace, key, limit),
        )
        return [_event(row) for row in rows]

    def events_bytes(self, namespace: str) -> int:
        rows = self._read("SELECT bytes FROM events_bytes WHERE namespace = ?", (namespace,))
        return _int(rows[0][0]) if rows else 0


# Rows of a namespace read per round while finding how many of its oldest to drop.
_TRIM_ROWS = 256


def _trim_namespace(conn: sqlite3.Connection, namespace: str, max_bytes: int) -> int:
    """Drop the oldest events of ``namespace`` until its bytes are at most
    ``max_bytes``; the number dropped. Reads its oldest rows through
    events_by_namespace only as far as the excess reaches, then drops them in one
    range delete: it costs what it drops."""
    row = conn.execute("SELECT bytes FROM events_bytes WHERE namespace = ?", (namespace,))
    found = row.fetchone()
    excess = (_int(found[0]) if found else 0) - max_bytes
    if excess <= 0:
        return 0
    oldest = conn.execute(
        "SELECT at, id, length(CAST(body AS BLOB)) FROM events WHERE namespace = ? ORDER BY at, id",
        (namespace,),
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
    at, event_id = last[0], last[1]
    deleted: int = conn.execute(
        "DELETE FROM events WHERE namespace = ? AND (at < ? OR (at = ? AND id <= ?))",
        (namespace, at, at, event_id),
    ).rowcount
    return deleted


def _row_place(row: tuple[object, ...]) -> tuple[float, int]:
    event_id, at = row[0], row[1]
    assert isinstance(event_id, int), event_id  # INTEGER PRIMARY KEY
    return real(at), event_id


def _event(row: tuple[object, ...]) -> Event:
    _id, at, namespace, kind, key, body = row
    return Event(real(at), str(namespace), str(kind), str(key), str(body))


def _int(value: object) -> int:
    assert isinstance(value, int), value  # a byte count: length() or an INTEGER column
    return value
