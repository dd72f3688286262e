"""SQLite storage of the embedded log: schema, per-process connections, retention.

One database file holds every channel. Writers serialize on SQLite's write lock
(BEGIN IMMEDIATE); readers never block writers (WAL). A batch is one transaction, so a
writer killed mid-batch leaves nothing of it behind.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendError, BackendTimeoutError, ConfigError

SCHEMA = """
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY, created_ms INTEGER NOT NULL, last_id INTEGER NOT NULL DEFAULT 0,
    removed_upto INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS messages (
    channel TEXT NOT NULL, id INTEGER NOT NULL, ts INTEGER NOT NULL, append_ms INTEGER NOT NULL,
    props TEXT NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (channel, id));
CREATE INDEX IF NOT EXISTS messages_ts ON messages (channel, ts, id);
CREATE TABLE IF NOT EXISTS subscriptions (
    sub TEXT NOT NULL, channel TEXT NOT NULL, cursor INTEGER NOT NULL, PRIMARY KEY (sub, channel));
CREATE TABLE IF NOT EXISTS metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


# The page size of a new log file. Messages are blobs of KBs to MBs (a 1000-row insert of 128-d vectors: ~0.5 MB):
# SQLite stores a blob over a chain of overflow pages, one page write (and, in WAL mode, one WAL frame) per page.
# 64 KiB pages cut the CPU of writing 51 MB in 2 MB transactions from ~0.12 to ~0.035 s (and of reading it back
# from ~0.014 to ~0.008 s); a transaction of one tiny message costs ~0.1 ms instead of ~0.03 ms (it writes
# whole pages). docs/benchmarks.md, "What a write costs, per stage". An existing file keeps the size it has.
PAGE_SIZE = 65536


class LocalSettings:
    """The ``local.*`` keys, validated."""

    def __init__(self, config: Config) -> None:
        path = config.get_str("local.path")
        if not path:
            raise ConfigError(f"config key local.path is empty ({config.source}): the embedded log needs a file")
        self.path = path
        self.busy_timeout = config.get_float("local.busytimeout")
        self.retention_ms = int(config.get_float("local.retentiontimeinminutes") * 60_000)
        self.retention_bytes = int(config.get_float("local.retentionsizeinmb") * 1024 * 1024)
        sync = config.get_str("local.synchronous").strip().lower() or "normal"
        if sync not in ("off", "normal", "full", "extra"):
            raise ConfigError(f"config key local.synchronous must be off, normal, full or extra, got {sync!r}")
        self.synchronous = sync
        self.mmap_bytes = int(config.get_float("local.mmapsizemb") * 1024 * 1024)


class Connection:
    """A lazily opened, pid-checked SQLite connection guarded by a lock (threads share it)."""

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self.lock = threading.RLock()

    def get(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self._conn = open_db(self.settings)
            self._pid = os.getpid()
        return self._conn

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def __getstate__(self):  # picklable: reopen in the new process
        return {"settings": self.settings}

    def __setstate__(self, state) -> None:
        self.__init__(state["settings"])


def open_db(s: LocalSettings) -> sqlite3.Connection:
    """Open (creating if needed) the log file in WAL mode.

    Several processes may open a fresh file at once (Spark tasks); switching the journal mode can
    report "database is locked" without consulting the busy handler, so the whole open is retried
    until ``local.busytimeout`` runs out.
    """
    Path(s.path).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + max(0.0, s.busy_timeout)
    delay = 0.01
    while True:
        try:
            return _open_once(s)
        except sqlite3.OperationalError as exc:
            transient = "locked" in str(exc) or "busy" in str(exc)
            if not transient or time.monotonic() >= deadline:
                raise BackendError(f"cannot open the embedded log at {s.path}: {exc}") from exc
        except (sqlite3.DatabaseError, BackendError) as exc:
            raise BackendError(f"cannot open the embedded log at {s.path}: {exc}") from exc
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))  # backoff between open attempts
        delay = min(delay * 2, 0.25)


def _open_once(s: LocalSettings) -> sqlite3.Connection:
    conn = sqlite3.connect(s.path, timeout=s.busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file's; an existing file keeps its own
        conn.execute(f"PRAGMA busy_timeout={int(s.busy_timeout * 1000)}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={s.synchronous.upper()}")
        conn.execute(f"PRAGMA mmap_size={s.mmap_bytes}")  # reads map the file instead of copying it in
        if _has_schema(conn):  # a read: no write lock to wait for behind another connection's transaction
            return conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in SCHEMA.strip().split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except BaseException:
        conn.close()
        raise
    return conn


_SCHEMA_OBJECTS = frozenset(stmt.split("EXISTS", 1)[1].split()[0] for stmt in SCHEMA.split(";") if "EXISTS" in stmt)


def _has_schema(conn: sqlite3.Connection) -> bool:
    """Every table and index of SCHEMA is in the file already (then opening writes nothing)."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    return _SCHEMA_OBJECTS <= names


class write_txn:  # noqa: N801 - used as a context manager like a function
    """BEGIN IMMEDIATE ... COMMIT, rolling back on error; lock timeouts become BackendTimeoutError."""

    def __init__(self, conn: sqlite3.Connection, channel: str) -> None:
        self.conn = conn
        self.channel = channel

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _lock_error(exc, self.channel, self.conn) from exc
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.conn.execute("COMMIT")
                return
            except sqlite3.Error as err:
                self._rollback()
                raise _lock_error(err, self.channel, self.conn) from err
        self._rollback()
        if isinstance(exc, sqlite3.Error):  # e.g. "database or disk is full" while inserting
            raise _lock_error(exc, self.channel, self.conn) from exc

    def _rollback(self) -> None:
        """Roll back if SQLite has not already done so itself (it does after a failed COMMIT on a full disk)."""
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def _db_file(conn: sqlite3.Connection | None) -> str:
    try:
        return conn.execute("PRAGMA database_list").fetchone()[2] if conn is not None else "?"
    except (sqlite3.Error, TypeError):
        return "?"


def _lock_error(exc: sqlite3.Error, channel: str, conn: sqlite3.Connection | None = None) -> BackendError:
    where = f"embedded log {_db_file(conn)}"
    if "locked" in str(exc) or "busy" in str(exc):
        return BackendTimeoutError(f"{where}: timed out waiting for the write lock held by another connection "
                                   f"(channel {channel}; local.busyTimeout): {exc}")
    return BackendError(f"{where}: write to channel {channel} failed, nothing of it was kept: {exc}")


def ensure_channel(conn: sqlite3.Connection, channel: str) -> None:
    conn.execute("INSERT OR IGNORE INTO channels (name, created_ms) VALUES (?, ?)",
                 (channel, int(time.time() * 1000)))


def apply_retention(conn: sqlite3.Connection, s: LocalSettings, channel: str | None = None) -> int:
    """Remove messages older than the age limit and beyond the size limit; returns rows removed."""
    removed = 0
    now = int(time.time() * 1000)
    chans = [channel] if channel else [r[0] for r in conn.execute("SELECT name FROM channels")]
    for ch in chans:
        with write_txn(conn, ch):
            upto = None
            if s.retention_ms > 0:
                row = conn.execute("SELECT MAX(id), COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM messages "
                                   "WHERE channel = ? AND append_ms < ?", (ch, now - s.retention_ms)).fetchone()
                if row[0] is not None:
                    upto = row[0]
            if s.retention_bytes > 0:
                total = conn.execute("SELECT bytes FROM channels WHERE name = ?", (ch,)).fetchone()
                excess = (total[0] if total else 0) - s.retention_bytes
                if excess > 0:
                    acc = 0
                    for mid, size in conn.execute("SELECT id, LENGTH(payload) FROM messages WHERE channel = ? "
                                                  "ORDER BY id", (ch,)):
                        acc += size
                        if acc >= excess:
                            upto = max(upto or 0, mid)
                            break
            if upto is None:
                continue
            row = conn.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM messages "
                               "WHERE channel = ? AND id <= ?", (ch, upto)).fetchone()
            conn.execute("DELETE FROM messages WHERE channel = ? AND id <= ?", (ch, upto))
            conn.execute("UPDATE channels SET removed_upto = MAX(removed_upto, ?), bytes = bytes - ? "
                         "WHERE name = ?", (upto, row[1], ch))
            removed += row[0]
    return removed
