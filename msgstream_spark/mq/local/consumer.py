"""Embedded-log consumer: reads by id range, cursor persisted per subscription."""

from __future__ import annotations

import json
import time
from types import MappingProxyType

from msgstream_spark.errors import ConsumeError, DataLossError
from msgstream_spark.mq.base import Consumer, Message, MessageID
from msgstream_spark.mq.batch import RawBatch
from msgstream_spark.mq.local.message_id import LocalMessageID
from msgstream_spark.mq.local.store import Connection, LocalSettings, write_txn

_FLUSH_EVERY_ACKS = 1000
_FLUSH_EVERY_S = 1.0
_POLL_MIN, _POLL_MAX = 0.002, 0.05


class LocalConsumer(Consumer):
    def __init__(self, settings: LocalSettings, channel: str, subscription: str, after: int | None,
                 recorded: bool = True) -> None:
        """``recorded``: the subscription has a row in the log (False: a reader's, until it acks)."""
        self.channel = channel
        self._sub = subscription
        self._recorded = recorded
        self._db = Connection(settings)
        self._after = after  # read ids > _after; None: a seek must come first
        self._acked: int | None = None
        self._acks_since_flush = 0
        self._last_flush = time.monotonic()
        self._closed = False
        self._props: dict[str, MappingProxyType] = {}

    @property
    def subscription(self) -> str:
        return self._sub

    def _check(self) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of channel {self.channel} ({self._sub}) is closed")
        if self._after is None:
            raise ConsumeError(f"consumer of channel {self.channel} was subscribed with initial position "
                               "unknown: seek before receiving")

    def _rows(self, limit: int) -> list[tuple]:
        """(id, ts, props, payload) of the next ``limit`` messages; advances the read position."""
        with self._db.lock:
            conn = self._db.get()
            rows = conn.execute("SELECT id, ts, props, payload FROM messages WHERE channel = ? AND id > ? "
                                "ORDER BY id LIMIT ?", (self.channel, self._after, limit)).fetchall()
            if rows and self._after > 0 and rows[0][0] > self._after + 1:
                removed = conn.execute("SELECT removed_upto FROM channels WHERE name = ?",
                                       (self.channel,)).fetchone()
                if removed and removed[0] > self._after:
                    raise DataLossError(
                        f"channel {self.channel}: messages {self._after + 1}..{rows[0][0] - 1} were removed by "
                        f"retention before subscription {self._sub} read them", channel=self.channel)
        if rows:
            self._after = rows[-1][0]
        return rows

    def _parsed(self, props: str) -> MappingProxyType:
        parsed = self._props.get(props)
        if parsed is None:
            parsed = MappingProxyType(json.loads(props))  # shared: read-only
            if len(self._props) < 256:  # properties repeat ({"msg_type": "Insert"}): parse once
                self._props[props] = parsed
        return parsed

    def _poll(self, max_messages: int, timeout: float) -> list[tuple]:
        """Rows as soon as there are some, else after polling up to ``timeout``."""
        self._check()
        deadline = time.monotonic() + max(0.0, timeout)
        delay = _POLL_MIN
        while True:
            rows = self._rows(max_messages)
            if rows:
                return rows
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)

    def receive_batch(self, max_messages: int, timeout: float) -> list[Message]:
        ch, parsed = self.channel, self._parsed
        return [Message(ch, payload, parsed(props), LocalMessageID(mid), ts)
                for mid, ts, props, payload in self._poll(max_messages, timeout)]

    def receive_raw(self, max_messages: int, timeout: float) -> RawBatch:
        rows = self._poll(max_messages, timeout)
        offsets = [r[0] for r in rows]
        parsed = self._parsed
        return RawBatch(self.channel, [r[3] for r in rows], offsets, rows, lambda i: LocalMessageID(offsets[i]),
                        lambda r: (parsed(r[2]), r[1]))

    def receive(self, timeout: float) -> Message | None:
        got = self.receive_batch(1, timeout)
        return got[0] if got else None

    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of channel {self.channel} ({self._sub}) is closed")
        target = msg_id.offset
        if target <= 0:  # earliest sentinel
            self._after = -1
            return
        with self._db.lock:
            row = self._db.get().execute("SELECT removed_upto FROM channels WHERE name = ?",
                                         (self.channel,)).fetchone()
        removed = row[0] if row else 0
        if target < removed or (inclusive and target == removed):
            raise DataLossError(f"channel {self.channel}: position {target} was removed by retention "
                                f"(messages up to {removed} are gone)", channel=self.channel)
        # ids are contiguous per channel: "after target-1" includes target, "after target" skips it
        self._after = target - 1 if inclusive else target

    def ack(self, message: Message) -> None:
        mid = message.id.offset
        if self._acked is None or mid > self._acked:
            self._acked = mid
        self._acks_since_flush += 1
        if self._acks_since_flush >= _FLUSH_EVERY_ACKS or time.monotonic() - self._last_flush > _FLUSH_EVERY_S:
            self._flush()

    def _flush(self) -> None:
        self._acks_since_flush = 0
        self._last_flush = time.monotonic()
        if self._acked is None:
            return
        with self._db.lock:
            conn = self._db.get()
            with write_txn(conn, self.channel):
                conn.execute("INSERT INTO subscriptions (sub, channel, cursor) VALUES (?, ?, ?) "
                             "ON CONFLICT (sub, channel) DO UPDATE SET cursor = MAX(cursor, excluded.cursor)",
                             (self._sub, self.channel, self._acked))
        self._recorded = True

    def latest_message_id(self) -> MessageID | None:
        with self._db.lock:
            row = self._db.get().execute("SELECT last_id FROM channels WHERE name = ?", (self.channel,)).fetchone()
        return LocalMessageID(row[0]) if row and row[0] > 0 else None

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._flush()
        finally:
            self._closed = True
            self._db.close()

    def unsubscribe(self) -> None:
        if self._closed:
            return
        self._acked = None  # nothing more to record
        try:
            if not self._recorded:  # never written to the log: nothing to remove (and no write lock to take)
                return
            with self._db.lock:
                conn = self._db.get()
                with write_txn(conn, self.channel):
                    conn.execute("DELETE FROM subscriptions WHERE sub = ? AND channel = ?", (self._sub, self.channel))
        finally:
            self.close()
