"""A SQLite index, ``sqlite:///abs/path/index.db``: one file, for one host.

Several server processes on one host may share the file: WAL lets readers run beside
the one writer, and the busy timeout makes a second writer wait instead of failing.
Each thread gets its own connection so that reads run concurrently; ``put_entry``
relies on the database, not on a Python lock, so it stays atomic across processes.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError, StoreFull

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

# Stored in PRAGMA user_version. Bump it when a table changes, and add the step from
# the previous version to _STEPS; a file newer than this code is refused at start-up.
SCHEMA_VERSION = 6

# How long a writer waits for another process's write transaction to finish.
BUSY_TIMEOUT_S = 5.0

# Version 1: entries, aliases, tokens.
_V1 = """
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    manifest TEXT NOT NULL,
    created_at REAL NOT NULL,
    writer TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE TABLE IF NOT EXISTS aliases (
    namespace TEXT NOT NULL,
    alias TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (namespace, alias)
);
CREATE TABLE IF NOT EXISTS tokens (
    token_id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL,
    namespaces TEXT NOT NULL,  -- a JSON list
    name TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0
);
"""

# Version 2: failure records. ``id`` breaks ties between records of one instant; the
# (namespace, key, created_at) index serves reads and trimming, the expires_at index
# the sweep of expired records on every write.
_V2 = """
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY,  -- a new row gets one above every row left: insertion order
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    record TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_by_key ON failures (namespace, key, created_at);
CREATE INDEX IF NOT EXISTS failures_by_expiry ON failures (expires_at);
"""

# Version 3: compile leases, one row per (namespace, name); expired rows are swept
# by later acquisitions through the expires_at index.
_V3 = """
CREATE TABLE IF NOT EXISTS leases (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    expected_seconds REAL,
    failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases (expires_at);
"""

# Version 4: eviction. Each entry's facts (EntryFacts; digests a JSON list) and use;
# last_access and the facts of rows from before are backfilled by _backfill_v4. The
# aliases index lets delete_entry find an entry's aliases. Tokens may be trusted.
# Records (policies, pins) and the audit log; the audit indexes serve reads by time,
# of all namespaces or of one (the rowid, i.e. id, closes each index: ties keep order).
_V4 = """
ALTER TABLE entries ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
ALTER TABLE entries ADD COLUMN compile_seconds REAL;
ALTER TABLE entries ADD COLUMN compiler_version TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN model TEXT NOT NULL DEFAULT '';
ALTER TABLE entries ADD COLUMN digests TEXT NOT NULL DEFAULT '[]';
ALTER TABLE entries ADD COLUMN last_access REAL NOT NULL DEFAULT 0;
ALTER TABLE entries ADD COLUMN hits INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS aliases_by_key ON aliases (namespace, key);
ALTER TABLE tokens ADD COLUMN trusted INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS records (
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,  -- insertion order, as for failures
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    namespace TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (at);
CREATE INDEX IF NOT EXISTS audit_by_namespace ON audit (namespace, at);
"""

# Version 5: telemetry events. The indexes serve reads by time, of all namespaces
# (events_by_time) or of one (events_by_namespace), and a key's newest
# (events_by_key); each ends in the rowid (id), so ties keep the order of appending.
# events_count holds the number of rows, so trimming to ``keep`` needs no count(*)
# over the whole table on every append.
_V5 = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,  -- insertion order, as for failures
    at REAL NOT NULL,
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (at);
CREATE INDEX IF NOT EXISTS events_by_namespace ON events (namespace, at);
CREATE INDEX IF NOT EXISTS events_by_key ON events (namespace, key, at);
CREATE TABLE IF NOT EXISTS events_count (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    n INTEGER NOT NULL
);
INSERT OR IGNORE INTO events_count (one, n) VALUES (1, 0);
"""

# Version 6: each namespace's event bytes (event_size: the body's UTF-8 bytes, which
# CAST AS BLOB gives), so its byte bound needs no sum over its rows on every append.
# Triggers keep the total with every insert and delete, whoever deletes. A trigger's
# body holds ";", which _migrate's split would cut: the statements run one by one in
# _events_bytes_v6. The first total of a file from before is summed once, here.
_V6 = (
    """CREATE TABLE IF NOT EXISTS events_bytes (
    namespace TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
) WITHOUT ROWID""",
    """INSERT INTO events_bytes (namespace, bytes)
SELECT namespace, sum(length(CAST(body AS BLOB))) FROM events GROUP BY namespace""",
    """CREATE TRIGGER IF NOT EXISTS events_bytes_added AFTER INSERT ON events BEGIN
INSERT INTO events_bytes (namespace, bytes)
VALUES (new.namespace, length(CAST(new.body AS BLOB)))
ON CONFLICT (namespace) DO UPDATE SET bytes = bytes + excluded.bytes;
END""",
    """CREATE TRIGGER IF NOT EXISTS events_bytes_dropped AFTER DELETE ON events BEGIN
UPDATE events_bytes SET bytes = bytes - length(CAST(old.body AS BLOB))
WHERE namespace = old.namespace;
END""",
)


def _events_bytes_v6(conn: sqlite3.Connection) -> None:
    for statement in _V6:
        conn.execute(statement)


_TOKEN_COLUMNS = "token_id, secret_hash, scope, namespaces, name, created_at, revoked, trusted"
_FACT_COLUMNS = "size, compile_seconds, compiler_version, model, digests"
_FACT_SETS = ", ".join(f"{column} = ?" for column in _FACT_COLUMNS.split(", "))
_STATS_COLUMNS = f"key, created_at, writer, {_FACT_COLUMNS}, last_access, hits"
_AUDIT_COLUMNS = "at, actor, action, namespace, target, detail"
_EVENT_COLUMNS = "id, at, namespace, kind, key, body"
# An alias that names a key with no entry (deleted) is free: it takes the new key.
# On SAME (it names this key) or CONFLICT (another live entry) it stays; rowcount 0.
_UPSERT_ALIAS = (
    "INSERT INTO aliases (namespace, alias, key) VALUES (?, ?, ?)"
    " ON CONFLICT (namespace, alias) DO UPDATE SET key = excluded.key"
    " WHERE NOT EXISTS"
    " (SELECT 1 FROM entries WHERE namespace = aliases.namespace AND key = aliases.key)"
)
_LEASE_COLUMNS = "lease_id, holder, acquired_at, expires_at, expected_seconds, failed"
# Newest first; of records created at the same instant, the later write first.
_NEWEST = "ORDER BY created_at DESC, id DESC"


# Rows read per statement while backfilling, so a large file is not read at once.
_BACKFILL_BATCH = 1000


def _backfill_v4(conn: sqlite3.Connection) -> None:
    """Give entries stored before version 4 their facts (from their manifests) and a
    ``last_access`` of now, the upgrade: their real use was never recorded, and
    ``created_at`` would expire every entry older than the TTL at the first pass,
    however much it is used. Pages by primary key rather than updating under an open
    cursor, whose results SQLite leaves undefined when its table changes."""
    conn.execute("UPDATE entries SET last_access = MAX(created_at, ?)", (time.time(),))
    after: tuple[str, str] = ("", "")
    while True:
        rows = conn.execute(
            "SELECT namespace, key, manifest FROM entries WHERE (namespace, key) > (?, ?)"
            " ORDER BY namespace, key LIMIT ?",
            (*after, _BACKFILL_BATCH),
        ).fetchall()
        if not rows:
            return
        conn.executemany(
            f"UPDATE entries SET {_FACT_SETS} WHERE namespace = ? AND key = ?",
            [(*_fact_values(entry_facts(manifest)), ns, key) for ns, key, manifest in rows],
        )
        after = (rows[-1][0], rows[-1][1])


# The statements that bring a file from version n - 1 to version n, by n; then, for
# some n, Python that fills what SQL alone cannot, in the same transaction.
_STEPS = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: ""}  # 6: all in its code
_STEP_CODE: dict[int, Callable[[sqlite3.Connection], None]] = {
    4: _backfill_v4,
    6: _events_bytes_v6,
}


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[None]:
    """Turn sqlite3 errors into the store errors the API maps to 503, and 507 when the
    disk (or quota) is full: the transaction was rolled back, nothing partial stays."""
    try:
        yield
    except sqlite3.Error as exc:
        if _is_full(exc):
            raise StoreFull(f"sqlite index {path}: {exc}") from exc
        raise StoreError(f"sqlite index {path}: {exc}") from exc


_SQLITE_FULL = 13  # sqlite3.SQLITE_FULL, named there only from Python 3.11


def _is_full(exc: sqlite3.Error) -> bool:
    # sqlite_errorcode is Python 3.11+; an extended code's low byte is its primary one.
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == _SQLITE_FULL
    return "database or disk is full" in str(exc)


class SqliteIndex:
    """An index in one SQLite file.

    >>> index = SqliteIndex.from_url("sqlite:///var/lib/neffcache/index.db")
    >>> index.get_entry("team-a", "ab" * 32) is None
    True
    """

    # Answers come from this machine: the server may call it on its event loop.
    local = True

    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.local()
        # Every connection handed out, so close() can close them all; guarded by _lock.
        self._connections: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()
        try:
            with _mapped(path):
                self._init_schema(self._connection())
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str) -> SqliteIndex:
        path = _path_from_url(url)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the index directory {path.parent}: {exc}") from exc
        return cls(path)

    # --- connections ------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._close_dead_threads()
                self._connections[threading.current_thread()] = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit BEGIN; writes say BEGIN IMMEDIATE themselves.
        # check_same_thread=False only so close() may close another thread's connection.
        conn = sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        # NORMAL is durable across process crashes in WAL mode; a power loss may drop the
        # last commits, which only costs recompiles.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _close_dead_threads(self) -> None:
        # Server thread pools retire idle threads; without this their connections
        # would stay open until close(). Caller holds _lock.
        for thread in [t for t in self._connections if not t.is_alive()]:
            self._connections.pop(thread).close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. IMMEDIATE takes the write lock up front, so the busy
        timeout applies; a deferred read that later upgrades would fail at once."""
        with _mapped(self._path):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # A failed COMMIT leaves the transaction open, and every later BEGIN
                # on this thread's connection would fail.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        # _mapped's rule without its context manager: every lookup reads here.
        try:
            rows: list[tuple[object, ...]] = self._connection().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            with _mapped(self._path):
                raise exc from None
        return rows

    # --- schema -----------------------------------------------------------------------

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        # journal_mode is stored in the file; it cannot change inside a transaction.
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"sqlite index {self._path}: cannot enable WAL (got {mode!r})")
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ConfigError(
                    f"index {self._path} has schema version {version}, newer than this "
                    f"server's {SCHEMA_VERSION}; upgrade neffcache"
                )
            if version < SCHEMA_VERSION:
                self._migrate(conn, version)

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        # Version 0 is a new file: it takes every step, in order.
        for step in range(version + 1, SCHEMA_VERSION + 1):
            # Not executescript(): it commits first, which would end this transaction.
            for statement in _STEPS[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
            code = _STEP_CODE.get(step)
            if code is not None:
                code(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # --- entries ----------------------------------------------------------------------

    def put_entry(self, entry: Entry, aliases: tuple[str, ...]) -> PutResult:
        with self._write() as conn:
            inserted = conn.execute(
                "INSERT INTO entries (namespace, key, manifest, created_at, writer,"
                f" {_FACT_COLUMNS}, last_access, hits)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT DO NOTHING",
                (
                    entry.namespace,
                    entry.key,
                    entry.manifest,
                    entry.created_at,
                    entry.writer,
                    *_fact_values(entry_facts(entry.manifest)),
                    entry.created_at,
                ),
            ).rowcount
            if inserted:
                conn.executemany(
                    _UPSERT_ALIAS, [(entry.namespace, alias, entry.key) for alias in aliases]
                )
                return PutResult.CREATED
            (existing,) = conn.execute(
                "SELECT manifest FROM entries WHERE namespace = ? AND key = ?",
                (entry.namespace, entry.key),
            ).fetchone()
            return PutResult.SAME if existing == entry.manifest else PutResult.CONFLICT

    def get_entry(self, namespace: str, key: str) -> Entry | None:
        rows = self._read(
            "SELECT manifest, created_at, writer FROM entries WHERE namespace = ? AND key = ?",
            (namespace, key),
        )
        if not rows:
            return None
        manifest, created_at, writer = rows[0]
        return Entry(namespace, key, str(manifest), _float(created_at), str(writer))

    def resolve_alias(self, namespace: str, alias: str) -> str | None:
        rows = self._read(
            "SELECT key FROM aliases WHERE namespace = ? AND alias = ?", (namespace, alias)
        )
        return str(rows[0][0]) if rows else None

    def aliases_of(self, namespace: str, key: str) -> list[str]:
        rows = self._read(  # aliases_by_key serves it
            "SELECT alias FROM aliases WHERE namespace = ? AND key = ? ORDER BY alias",
            (namespace, key),
        )
        return [str(row[0]) for row in rows]

    def add_alias(self, namespace: str, alias: str, key: str) -> PutResult | None:
        with self._write() as conn:
            found = conn.execute(
                "SELECT 1 FROM entries WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
            if found is None:
                return None
            inserted = conn.execute(_UPSERT_ALIAS, (namespace, alias, key)).rowcount
            if inserted:
                return PutResult.CREATED
            (named,) = conn.execute(
                "SELECT key FROM aliases WHERE namespace = ? AND alias = ?", (namespace, alias)
            ).fetchone()
            return PutResult.SAME if named == key else PutResult.CONFLICT

    # --- failures ---------------------------------------------------------------------

    def put_failure(self, failure: Failure, keep: int) -> None:
        with self._write() as conn:
            # Expired records of any key, a bounded batch per write: storage holds only
            # live records once writes catch up, and a write never holds the file lock
            # (which publishing shares) for an unbounded sweep.
            conn.execute(
                "DELETE FROM failures WHERE id IN"
                " (SELECT id FROM failures WHERE expires_at <= ? ORDER BY expires_at LIMIT 1000)",
                (failure.created_at,),
            )
            conn.execute(
                "INSERT INTO failures (namespace, key, record, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    failure.namespace,
                    failure.key,
                    failure.record,
                    failure.created_at,
                    failure.expires_at,
                ),
            )
            conn.execute(
                "DELETE FROM failures WHERE namespace = ? AND key = ? AND id NOT IN"
                f" (SELECT id FROM failures WHERE namespace = ? AND key = ? {_NEWEST} LIMIT ?)",
                (failure.namespace, failure.key, failure.namespace, failure.key, keep),
            )

    def failures(self, namespace: str, key: str, now: float) -> list[Failure]:
        rows = self._read(
            "SELECT record, created_at, expires_at FROM failures"
            f" WHERE namespace = ? AND key = ? AND expires_at > ? {_NEWEST}",
            (namespace, key, now),
        )
        return [
            Failure(namespace, key, str(record), _float(created_at), _float(expires_at))
            for record, created_at, expires_at in rows
        ]

    # --- leases -----------------------------------------------------------------------

    def acquire_lease(self, lease: Lease, replacing: str | None = None) -> Lease:
        with self._write() as conn:
            # Expired leases of any name, a bounded batch (as for failure records); the
            # one under this name, if expired, goes with them, which frees the name.
            conn.execute(
                "DELETE FROM leases WHERE rowid IN"
                " (SELECT rowid FROM leases WHERE expires_at <= ? ORDER BY expires_at LIMIT 1000)",
                (lease.acquired_at,),
            )
            conn.execute(
                "DELETE FROM leases WHERE namespace = ? AND name = ?"
                " AND (expires_at <= ? OR lease_id = ?)",
                (lease.namespace, lease.name, lease.acquired_at, replacing),
            )
            inserted = conn.execute(
                f"INSERT INTO leases (namespace, name, {_LEASE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    lease.namespace,
                    lease.name,
                    lease.lease_id,
                    lease.holder,
                    lease.acquired_at,
                    lease.expires_at,
                    lease.expected_seconds,
                    int(lease.failed),
                ),
            ).rowcount
            if inserted:
                return lease
            row = conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM leases WHERE namespace = ? AND name = ?",
                (lease.namespace, lease.name),
            ).fetchone()
            return _lease(lease.namespace, lease.name, row)

    def renew_lease(self, namespace: str, name: str, lease_id: str, expires_at: float) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE leases SET expires_at = ?"
                " WHERE namespace = ? AND name = ? AND lease_id = ? AND failed = 0",
                (expires_at, namespace, name, lease_id),
            )
            return cursor.rowcount == 1

    def release_lease(
        self, namespace: str, name: str, lease_id: str, failed_until: float | None
    ) -> bool:
        where = (namespace, name, lease_id)
        with self._write() as conn:
            if failed_until is None:
                cursor = conn.execute(
                    "DELETE FROM leases"
                    " WHERE namespace = ? AND name = ? AND lease_id = ? AND failed = 0",
                    where,
                )
            else:
                cursor = conn.execute(
                    "UPDATE leases SET failed = 1, expires_at = ?"
                    " WHERE namespace = ? AND name = ? AND lease_id = ? AND failed = 0",
                    (failed_until, *where),
                )
            return cursor.rowcount == 1

    def get_lease(self, namespace: str, name: str, now: float) -> Lease | None:
        rows = self._read(
            f"SELECT {_LEASE_COLUMNS} FROM leases"
            " WHERE namespace = ? AND name = ? AND expires_at > ?",
            (namespace, name, now),
        )
        return _lease(namespace, name, rows[0]) if rows else None

    # --- tokens -----------------------------------------------------------------------

    def put_token(self, token: Token) -> None:
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    token.token_id,
                    token.secret_hash,
                    token.scope,
                    json.dumps(list(token.namespaces)),
                    token.name,
                    token.created_at,
                    int(token.revoked),
                    int(token.trusted),
                ),
            )

    def token_by_hash(self, secret_hash: str) -> Token | None:
        rows = self._read(
            f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE secret_hash = ?", (secret_hash,)
        )
        return _token(rows[0]) if rows else None

    def tokens(self) -> list[Token]:
        rows = self._read(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY created_at, token_id", ())
        return [_token(row) for row in rows]

    def revoke_token(self, token_id: str) -> bool:
        with self._write() as conn:
            cursor = conn.execute("UPDATE tokens SET revoked = 1 WHERE token_id = ?", (token_id,))
            return cursor.rowcount == 1

    # --- lifecycle --------------------------------------------------------------------

    def check(self) -> None:
        self._read("SELECT 1", ())

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    # --- listing

    def list_entries(self, namespace: str, after: str | None, limit: int) -> list[Entry]:
        # The primary key (namespace, key) serves both the range and the order.
        rows = self._read(
            "SELECT key, manifest, created_at, writer FROM entries"
            " WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (namespace, after or "", limit),
        )
        return [
            Entry(namespace, str(key), str(manifest), _float(created_at), str(writer))
            for key, manifest, created_at, writer in rows
        ]

    # --- eviction

    def entry_stats(self, namespace: str, after: str | None, limit: int) -> list[EntryStats]:
        rows = self._read(
            f"SELECT {_STATS_COLUMNS} FROM entries"
            " WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (namespace, after or "", limit),
        )
        return [_stats(namespace, row) for row in rows]

    def touch_entries(self, touches: Sequence[Touch]) -> None:
        if not touches:
            return
        # One transaction for the batch: one fsync and one wait for the write lock
        # instead of one per touch. An UPDATE of an absent entry matches no row.
        with self._write() as conn:
            conn.executemany(
                "UPDATE entries SET last_access = MAX(last_access, ?), hits = hits + ?"
                " WHERE namespace = ? AND key = ?",
                [(t.at, t.hits, t.namespace, t.key) for t in touches],
            )

    def delete_entry(self, namespace: str, key: str, created_at: float) -> bool:
        with self._write() as conn:
            # REAL holds the double that was written, so equality is exact.
            deleted = conn.execute(
                "DELETE FROM entries WHERE namespace = ? AND key = ? AND created_at = ?",
                (namespace, key, created_at),
            ).rowcount
            if deleted:
                conn.execute(
                    "DELETE FROM aliases WHERE namespace = ? AND key = ?", (namespace, key)
                )
            return deleted == 1

    def namespaces(self) -> list[str]:
        # DISTINCT over the primary key's leading column: an index scan, no sort.
        rows = self._read("SELECT DISTINCT namespace FROM entries ORDER BY namespace", ())
        return [str(namespace) for (namespace,) in rows]

    # --- records

    def put_record(
        self, record: Record, *, create_only: bool = False, replacing: str | None = None
    ) -> bool:
        on_conflict = "DO NOTHING" if create_only else "DO UPDATE SET value = excluded.value"
        with self._write() as conn:
            if replacing is not None and not create_only:
                return (
                    conn.execute(
                        "UPDATE records SET value = ?"
                        " WHERE kind = ? AND namespace = ? AND name = ? AND value = ?",
                        (record.value, record.kind, record.namespace, record.name, replacing),
                    ).rowcount
                    == 1
                )
            stored = conn.execute(
                "INSERT INTO records (kind, namespace, name, value) VALUES (?, ?, ?, ?)"
                f" ON CONFLICT (kind, namespace, name) {on_conflict}",
                (record.kind, record.namespace, record.name, record.value),
            ).rowcount
            return stored == 1

    def get_record(self, kind: str, namespace: str, name: str) -> Record | None:
        rows = self._read(
            "SELECT value FROM records WHERE kind = ? AND namespace = ? AND name = ?",
            (kind, namespace, name),
        )
        return Record(kind, namespace, name, str(rows[0][0])) if rows else None

    def delete_record(self, kind: str, namespace: str, name: str) -> bool:
        with self._write() as conn:
            deleted = conn.execute(
                "DELETE FROM records WHERE kind = ? AND namespace = ? AND name = ?",
                (kind, namespace, name),
            ).rowcount
            return deleted == 1

    def records(self, kind: str, namespace: str | None = None) -> list[Record]:
        # The primary key (kind, namespace, name) serves the filter and the order.
        if namespace is None:
            rows = self._read(
                "SELECT namespace, name, value FROM records WHERE kind = ?"
                " ORDER BY namespace, name",
                (kind,),
            )
        else:
            rows = self._read(
                "SELECT namespace, name, value FROM records WHERE kind = ? AND namespace = ?"
                " ORDER BY name",
                (kind, namespace),
            )
        return [Record(kind, str(ns), str(name), str(value)) for ns, name, value in rows]

    # --- audit log

    def append_audit(self, records: Sequence[AuditRecord], keep: int) -> None:
        with self._write() as conn:
            conn.executemany(
                f"INSERT INTO audit ({_AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                [(r.at, r.actor, r.action, r.namespace, r.target, r.detail) for r in records],
            )
            # The id of the newest row past ``keep`` (NULL when there are fewer rows,
            # which deletes nothing): a range delete on the primary key, where
            # NOT IN (the kept ids) would build the kept set on every append.
            conn.execute(
                "DELETE FROM audit WHERE id <="
                " (SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (keep,),
            )

    def audit(self, since: float, namespace: str | None, limit: int) -> list[AuditRecord]:
        # Of one instant, the later append (higher id) first.
        if namespace is None:
            rows = self._read(
                f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE at >= ?"
                " ORDER BY at DESC, id DESC LIMIT ?",
                (since, limit),
            )
        else:
            rows = self._read(
                f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE namespace = ? AND at >= ?"
                " ORDER BY at DESC, id DESC LIMIT ?",
                (namespace, since, limit),
            )
        return [_audit_record(row) for row in rows]

    # --- telemetry events

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
    return _float(at), event_id


def _event(row: tuple[object, ...]) -> Event:
    _id, at, namespace, kind, key, body = row
    return Event(_float(at), str(namespace), str(kind), str(key), str(body))


def _int(value: object) -> int:
    assert isinstance(value, int), value  # a byte count: length() or an INTEGER column
    return value


def _path_from_url(url: str) -> Path:
    # "sqlite:///abs/path" leaves "/abs/path"; "sqlite://rel/path" leaves "rel/path".
    raw = url.removeprefix("sqlite://")
    path = Path(raw)
    if not raw or not path.is_absolute() or raw.endswith("/"):
        raise ConfigError(
            f"index URL {url!r} needs an absolute file path: sqlite:///abs/path/index.db "
            "(three slashes)"
        )
    return path


def _float(value: object) -> float:
    assert isinstance(value, (int, float)), value  # the column is REAL NOT NULL
    return float(value)


def _fact_values(facts: EntryFacts) -> tuple[object, ...]:
    """The values of _FACT_COLUMNS, in order."""
    return (
        facts.size,
        facts.compile_seconds,
        facts.compiler_version,
        facts.model,
        json.dumps(list(facts.digests)),
    )


def _stats(namespace: str, row: tuple[object, ...]) -> EntryStats:
    key, created_at, writer, size, seconds, version, model, digests, last_access, hits = row
    assert isinstance(size, int), size  # INTEGER NOT NULL
    assert isinstance(hits, int), hits  # INTEGER NOT NULL
    facts = EntryFacts(
        size=size,
        compile_seconds=None if seconds is None else _float(seconds),
        compiler_version=str(version),
        model=str(model),
        digests=tuple(json.loads(str(digests))),
    )
    return EntryStats(
        namespace=namespace,
        key=str(key),
        created_at=_float(created_at),
        writer=str(writer),
        facts=facts,
        last_access=_float(last_access),
        hits=hits,
    )


def _audit_record(row: tuple[object, ...]) -> AuditRecord:
    at, actor, action, namespace, target, detail = row
    return AuditRecord(
        at=_float(at),
        actor=str(actor),
        action=str(action),
        namespace=str(namespace),
        target=str(target),
        detail=str(detail),
    )


def _lease(namespace: str, name: str, row: tuple[object, ...]) -> Lease:
    lease_id, holder, acquired_at, expires_at, expected, failed = row
    return Lease(
        namespace=namespace,
        name=name,
        lease_id=str(lease_id),
        holder=str(holder),
        acquired_at=_float(acquired_at),
        expires_at=_float(expires_at),
        expected_seconds=None if expected is None else _float(expected),
        failed=bool(failed),
    )


def _token(row: tuple[object, ...]) -> Token:
    token_id, secret_hash, scope, namespaces, name, created_at, revoked, trusted = row
    return Token(
        token_id=str(token_id),
        secret_hash=str(secret_hash),
        scope=str(scope),
        namespaces=tuple(json.loads(str(namespaces))),
        name=str(name),
        created_at=_float(created_at),
        revoked=bool(revoked),
        trusted=bool(trusted),
    )
