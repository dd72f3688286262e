"""Embedded-log producer: a batch is one transaction with contiguous ids."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from msgstream_spark.errors import MsgStreamError, ProduceError
from msgstream_spark.mq.base import MessageID, Producer, ProducerMessage
from msgstream_spark.mq.local.message_id import LocalMessageID
from msgstream_spark.mq.local.store import (
    Connection,
    LocalSettings,
    apply_retention,
    ensure_channel,
    write_txn,
)

RETENTION_EVERY_S = 30.0


def _first_id() -> int:
    """RocksMQ 2.4+: an empty topic starts at a TSO-shaped id (now << 18) + 1."""
    return (int(time.time() * 1000) << 18) + 1


class LocalProducer(Producer):
    """``db``: a connection shared with the client that made this producer (its other producers write through it
    one after another, where connections of their own would wait on SQLite's write lock in its busy handler's
    sleeps); the client closes it. Without ``db`` the producer opens and closes a connection of its own."""

    def __init__(self, settings: LocalSettings, channel: str, db: Connection | None = None) -> None:
        self.channel = channel
        self._settings = settings
        self._own_db = db is None
        self._db = Connection(settings) if db is None else db
        self._closed = False
        self._last_retention = time.monotonic()
        with self._db.lock:
            conn = self._db.get()
            with write_txn(conn, channel):
                ensure_channel(conn, channel)

    def send(self, message: ProducerMessage) -> MessageID:
        return self.send_batch([message])[0]

    def send_batch(self, messages: Sequence[ProducerMessage]) -> list[MessageID]:
        if self._closed:
            raise ProduceError(f"producer of channel {self.channel} is closed", channel=self.channel)
        if not messages:
            return []
        now_ms = int(time.time() * 1000)
        default_ts = now_ms << 18
        try:
            rows = [(m.timestamp if m.timestamp is not None else default_ts,
                     json.dumps(dict(m.properties), separators=(",", ":")) if m.properties else "{}",
                     bytes(m.payload)) for m in messages]
        except (TypeError, ValueError) as exc:
            raise ProduceError(f"bad message for channel {self.channel}: {exc}", channel=self.channel,
                               failures=[(i, str(exc)) for i in range(len(messages))],
                               ids=[None] * len(messages)) from exc
        size = sum(len(r[2]) for r in rows)
        try:
            with self._db.lock:
                conn = self._db.get()
                with write_txn(conn, self.channel):
                    row = conn.execute("SELECT last_id FROM channels WHERE name = ?", (self.channel,)).fetchone()
                    if row is None:
                        ensure_channel(conn, self.channel)
                        last = 0
                    else:
                        last = row[0]
                    first = last + 1 if last > 0 else _first_id()
                    conn.executemany(
                        "INSERT INTO messages (channel, id, ts, append_ms, props, payload) VALUES (?, ?, ?, ?, ?, ?)",
                        [(self.channel, first + i, r[0], now_ms, r[1], r[2]) for i, r in enumerate(rows)])
                    conn.execute("UPDATE channels SET last_id = ?, bytes = bytes + ? WHERE name = ?",
                                 (first + len(rows) - 1, size, self.channel))
        except MsgStreamError as exc:
            raise ProduceError(f"{len(messages)} messages not written to channel {self.channel}: {exc}",
                               channel=self.channel, failures=[(i, str(exc)) for i in range(len(messages))],
                               ids=[None] * len(messages)) from exc
        self._maybe_retention()
        return [LocalMessageID(first + i) for i in range(len(rows))]

    def _maybe_retention(self) -> None:
        if time.monotonic() - self._last_retention < RETENTION_EVERY_S:
            return
        self._last_retention = time.monotonic()
        with self._db.lock:
            apply_retention(self._db.get(), self._settings, self.channel)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._own_db:
                self._db.close()
