"""The SQLite index's schema (sqlite.py): each version's tables, and the steps that
bring an older file up to this one, run in one transaction when a server opens it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable

from .audit import AUDIT_LOG
from .base import EntryFacts, Failure, Lease, Token, entry_facts
from .events import EVENTS
from .failures import failure_item, failures_log
from .leases import lease_key, lease_value
from .records import record_field, records_map
from .tokens import TOKENS, token_value

# Stored in PRAGMA user_version. Bump it when a table changes, and add the step from
# the previous version to STEPS; a file newer than this code is refused at start-up.
SCHEMA_VERSION = 9


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


# Version 7: the primitives (primitives.py) of the roles written once over every
# backend: cells, for leases (leases.py), and log items, for failure records
# (failures.py); the expiry indexes serve the sweeps of expired rows on every write.
# Live leases and failure records move here, and their old tables are dropped: a server
# of version 6 still running on this file (it checks the version only when it starts)
# then fails its lease and failure requests, and its clients compile without a lease,
# rather than granting names the new tables already hold, or keeping records no new
# server reads. An upgrade stops the old server first (docs/operations.md, single node).
_V7 = """
CREATE TABLE IF NOT EXISTS cells (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cells_by_expiry ON cells (expires_at);
CREATE TABLE IF NOT EXISTS log_items (
    log TEXT NOT NULL,
    item TEXT NOT NULL,
    score REAL NOT NULL,
    PRIMARY KEY (log, item)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS log_items_by_score ON log_items (score);
"""


def _to_primitives_v7(conn: sqlite3.Connection) -> None:
    now = time.time()
    failures = conn.execute(
        "SELECT namespace, key, record, created_at, expires_at FROM failures WHERE expires_at > ?",
        (now,),
    ).fetchall()
    conn.executemany(
        "INSERT OR REPLACE INTO log_items (log, item, score) VALUES (?, ?, ?)",
        [
            (failures_log(f.namespace, f.key), failure_item(f), f.expires_at)
            for f in (
                Failure(str(ns), str(key), str(record), real(created), real(expires))
                for ns, key, record, created, expires in failures
            )
        ],
    )
    rows = conn.execute(
        f"SELECT namespace, name, {_LEASE_COLUMNS} FROM leases WHERE expires_at > ?",
        (now,),
    ).fetchall()
    conn.executemany(
        "INSERT OR REPLACE INTO cells (key, value, expires_at) VALUES (?, ?, ?)",
        [
            (lease_key(lease.namespace, lease.name), lease_value(lease), lease.expires_at)
            for lease in (_lease(str(ns), str(name), tuple(rest)) for ns, name, *rest in rows)
        ],
    )
    conn.execute("DROP TABLE leases")
    conn.execute("DROP TABLE failures")


# Version 8: maps (primitives.py), for tokens (tokens.py) and records (records.py).
# Every token and record moves here, and the old tables are dropped, as in version 7:
# a server of version 7 still running on this file then fails every token and record
# request (fail closed: no request is authorised by a token this file no longer
# revokes, no policy is read stale) until it is stopped.
_V8 = """
CREATE TABLE IF NOT EXISTS map_fields (
    map TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (map, field)
) WITHOUT ROWID
"""


def _to_maps_v8(conn: sqlite3.Connection) -> None:
    tokens = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens").fetchall()
    records = conn.execute("SELECT kind, namespace, name, value FROM records").fetchall()
    conn.executemany(
        "INSERT OR REPLACE INTO map_fields (map, field, value) VALUES (?, ?, ?)",
        [(TOKENS, token.secret_hash, token_value(token)) for token in map(_token, tokens)]
        + [
            (records_map(str(kind)), record_field(str(ns), str(name)), str(value))
            for kind, ns, name, value in records
        ],
    )
    conn.execute("DROP TABLE tokens")
    conn.execute("DROP TABLE records")


# Version 9: sequences (sequences.py), for the events log (events.py) and the audit
# log (audit.py). Every event moves here with its id, so cursors handed out before
# stay good, then every audit record in its order (with an id after them: the audit
# log hands out no cursor); the old tables go (their triggers with them), as in
# version 7: a server of version 8 still running on this file then fails its event
# appends, reports and audit reads and writes until it is stopped, rather than
# writing what no new server reads. The rowid is the sequence, one counter for
# every log; each index ends in it, so ties keep the order of appending. The counts
# and bytes are kept as events_count and events_bytes were (versions 5 and 6): the
# count by each append, the bytes by triggers, whose bodies hold ";" (run one by one).
_V9 = (
    """CREATE TABLE IF NOT EXISTS sequence_items (
    id INTEGER PRIMARY KEY,
    log TEXT NOT NULL,
    at REAL NOT NULL,
    grp TEXT NOT NULL,
    tag TEXT NOT NULL,
    head TEXT NOT NULL,
    body TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS sequence_items_by_time ON sequence_items (log, at)",
    "CREATE INDEX IF NOT EXISTS sequence_items_by_group ON sequence_items (log, grp, at)",
    "CREATE INDEX IF NOT EXISTS sequence_items_by_tag ON sequence_items (log, grp, tag, at)",
    """CREATE TABLE IF NOT EXISTS sequence_counts (
    log TEXT PRIMARY KEY,
    n INTEGER NOT NULL
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS sequence_bytes (
    log TEXT NOT NULL,
    grp TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (log, grp)
) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS sequence_bytes_added AFTER INSERT ON sequence_items BEGIN
INSERT INTO sequence_bytes (log, grp, bytes)
VALUES (new.log, new.grp, length(CAST(new.body AS BLOB)))
ON CONFLICT (log, grp) DO UPDATE SET bytes = bytes + excluded.bytes;
END""",
    """CREATE TRIGGER IF NOT EXISTS sequence_bytes_dropped AFTER DELETE ON sequence_items BEGIN
UPDATE sequence_bytes SET bytes = bytes - length(CAST(old.body AS BLOB))
WHERE log = old.log AND grp = old.grp;
END""",
)


def _to_sequences_v9(conn: sqlite3.Connection) -> None:
    for statement in _V9:
        conn.execute(statement)
    conn.execute(
        "INSERT INTO sequence_items (id, log, at, grp, tag, head, body)"
        " SELECT id, ?, at, namespace, key, kind, body FROM events",
        (EVENTS,),
    )
    conn.execute("INSERT INTO sequence_counts (log, n) SELECT ?, count(*) FROM events", (EVENTS,))
    conn.execute(
        "INSERT INTO sequence_items (log, at, grp, tag, head, body)"
        " SELECT ?, at, namespace, '', action, json_array(actor, target, detail)"
        " FROM audit ORDER BY id",
        (AUDIT_LOG,),
    )
    conn.execute("INSERT INTO sequence_counts (log, n) SELECT ?, count(*) FROM audit", (AUDIT_LOG,))
    conn.execute("DROP TABLE audit")
    conn.execute("DROP TABLE events")
    conn.execute("DROP TABLE events_count")
    conn.execute("DROP TABLE events_bytes")


FACT_COLUMNS = "size, compile_seconds, compiler_version, model, digests"
_FACT_SETS = ", ".join(f"{column} = ?" for column in FACT_COLUMNS.split(", "))
_TOKEN_COLUMNS = "token_id, secret_hash, scope, namespaces, name, created_at, revoked, trusted"
_LEASE_COLUMNS = "lease_id, holder, acquired_at, expires_at, expected_seconds, failed"


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
            [(*fact_values(entry_facts(manifest)), ns, key) for ns, key, manifest in rows],
        )
        after = (rows[-1][0], rows[-1][1])


# The statements that bring a file from version n - 1 to version n, by n; then, for
# some n, Python that fills what SQL alone cannot, in the same transaction.
STEPS = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: "", 7: _V7, 8: _V8, 9: ""}  # 6, 9: in code
_STEP_CODE: dict[int, Callable[[sqlite3.Connection], None]] = {
    4: _backfill_v4,
    6: _events_bytes_v6,
    7: _to_primitives_v7,
    8: _to_maps_v8,
    9: _to_sequences_v9,
}


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a file at ``version`` to ``SCHEMA_VERSION``, in the caller's transaction."""
    # Version 0 is a new file: it takes every step, in order.
    for step in range(version + 1, SCHEMA_VERSION + 1):
        # Not executescript(): it commits first, which would end this transaction.
        for statement in STEPS[step].split(";"):
            if statement.strip():
                conn.execute(statement)
        code = _STEP_CODE.get(step)
        if code is not None:
            code(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def fact_values(facts: EntryFacts) -> tuple[object, ...]:
    """The values of FACT_COLUMNS, in order."""
    return (
        facts.size,
        facts.compile_seconds,
        facts.compiler_version,
        facts.model,
        json.dumps(list(facts.digests)),
    )


def _lease(namespace: str, name: str, row: tuple[object, ...]) -> Lease:
    lease_id, holder, acquired_at, expires_at, expected, failed = row
    return Lease(
        namespace=namespace,
        name=name,
        lease_id=str(lease_id),
        holder=str(holder),
        acquired_at=real(acquired_at),
        expires_at=real(expires_at),
        expected_seconds=None if expected is None else real(expected),
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
        created_at=real(created_at),
        revoked=bool(revoked),
        trusted=bool(trusted),
    )


def real(value: object) -> float:
    assert isinstance(value, (int, float)), value  # the column is REAL NOT NULL
    return float(value)
