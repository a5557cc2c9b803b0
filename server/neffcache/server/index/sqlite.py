"""A SQLite index, ``sqlite:///abs/path/index.db``: one file, for one host.

Several server processes on one host may share the file: WAL lets readers run beside
the one writer, and the busy timeout makes a second writer wait instead of failing.
Each thread gets its own connection so that reads run concurrently; every write
relies on the database, not on a Python lock, so it stays atomic across processes.
The schema and its migrations are in sqlite_schema.py; every role is written once
over the primitives (primitive_roles.py over sqlite_primitives.py,
sqlite_sequences.py and sqlite_catalogs.py): this module holds the connections.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from neffcache.server.config_errors import ConfigError
from neffcache.server.errors import StoreError, StoreFull

from .primitive_roles import PrimitiveRoles
from .sqlite_catalogs import SqliteCatalogs
from .sqlite_primitives import SqliteCells, SqliteLogs, SqliteMaps
from .sqlite_schema import SCHEMA_VERSION, migrate
from .sqlite_sequences import SqliteSequences

# How long a writer waits for another process's write transaction to finish.
BUSY_TIMEOUT_S = 5.0


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


class SqliteIndex(PrimitiveRoles):
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
        # Every role written once over primitives.
        super().__init__(
            SqliteCells(self._read, self._write),
            SqliteLogs(self._read, self._write),
            SqliteMaps(self._read, self._write),
            SqliteSequences(self._read, self._write),
            SqliteCatalogs(self._read, self._write),
        )
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
                migrate(conn, version)

    # --- lifecycle --------------------------------------------------------------------

    def check(self) -> None:
        self._read("SELECT 1", ())

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


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
