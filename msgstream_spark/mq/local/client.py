"""LocalClient: the embedded log's entry point (config key ``local.path``)."""

from __future__ import annotations

from msgstream_spark.config import Config
from msgstream_spark.errors import ConfigError, ConsumeError
from msgstream_spark.mq.base import Client, Consumer, MessageID, Producer, SubscriptionInitialPosition
from msgstream_spark.mq.local.consumer import LocalConsumer
from msgstream_spark.mq.local.message_id import EARLIEST, LocalMessageID
from msgstream_spark.mq.local.producer import LocalProducer
from msgstream_spark.mq.local.store import Connection, LocalSettings, apply_retention, ensure_channel, write_txn


class LocalClient(Client):
    name = "local"

    def __init__(self, config: Config) -> None:
        self.settings = LocalSettings(config)
        self._db = Connection(self.settings)
        self._closed = False

    def _conn(self):
        if self._closed:
            raise ConsumeError("the embedded-log client is closed")
        return self._db.get()

    def create_producer(self, channel: str) -> Producer:
        self._check_name(channel)
        if self._closed:
            raise ConsumeError("the embedded-log client is closed")
        return LocalProducer(self.settings, channel, self._db)  # the client's connection: it closes it

    def subscribe(self, channel: str, subscription: str,
                  initial_position: SubscriptionInitialPosition = SubscriptionInitialPosition.EARLIEST) -> Consumer:
        self._check_name(channel)
        pos = SubscriptionInitialPosition.parse(initial_position)
        if pos == SubscriptionInitialPosition.UNKNOWN:  # a reader: nothing to record, no write lock to wait for
            with self._db.lock:
                conn = self._conn()
                known = conn.execute("SELECT 1 FROM channels WHERE name = ?", (channel,)).fetchone() is not None
                row = conn.execute("SELECT cursor FROM subscriptions WHERE sub = ? AND channel = ?",
                                   (subscription, channel)).fetchone()
            if known:
                return LocalConsumer(self.settings, channel, subscription, None if row is None else row[0],
                                     recorded=row is not None)
        with self._db.lock:
            conn = self._conn()
            with write_txn(conn, channel):
                ensure_channel(conn, channel)
                row = conn.execute("SELECT cursor FROM subscriptions WHERE sub = ? AND channel = ?",
                                   (subscription, channel)).fetchone()
                if row is not None:
                    after: int | None = row[0]
                elif pos == SubscriptionInitialPosition.UNKNOWN:
                    after = None
                else:
                    if pos == SubscriptionInitialPosition.LATEST:
                        after = conn.execute("SELECT last_id FROM channels WHERE name = ?", (channel,)).fetchone()[0]
                    else:
                        after = -1
                    conn.execute("INSERT INTO subscriptions (sub, channel, cursor) VALUES (?, ?, ?)",
                                 (subscription, channel, after))
        return LocalConsumer(self.settings, channel, subscription, after,
                             recorded=row is not None or pos != SubscriptionInitialPosition.UNKNOWN)

    @staticmethod
    def _check_name(channel: str) -> None:
        if not channel or not isinstance(channel, str):
            raise ConfigError(f"invalid channel name {channel!r}")

    def earliest_message_id(self) -> MessageID:
        return LocalMessageID(EARLIEST)

    def message_id_from_offset(self, offset: int) -> MessageID:
        return LocalMessageID(offset)

    def bytes_to_message_id(self, data: bytes) -> MessageID:
        return LocalMessageID.deserialize(data)

    def _one(self, sql: str, *args) -> int | None:
        with self._db.lock:
            row = self._conn().execute(sql, args).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def latest_message_id(self, channel: str) -> MessageID | None:
        v = self._one("SELECT last_id FROM channels WHERE name = ?", channel)
        return LocalMessageID(v) if v else None

    def first_message_id(self, channel: str) -> MessageID | None:
        v = self._one("SELECT MIN(id) FROM messages WHERE channel = ?", channel)
        return LocalMessageID(v) if v is not None else None

    def message_id_at_timestamp(self, channel: str, hybrid_ts: int) -> MessageID | None:
        v = self._one("SELECT MIN(id) FROM messages WHERE channel = ? AND ts >= ?", channel, int(hybrid_ts))
        return LocalMessageID(v) if v is not None else None

    def list_channels(self) -> list[str]:
        with self._db.lock:
            return [r[0] for r in self._conn().execute("SELECT name FROM channels ORDER BY name")]

    def channel_exists(self, channel: str) -> bool:
        return self._one("SELECT 1 FROM channels WHERE name = ?", channel) is not None

    def put_metadata(self, key: str, value: str) -> None:
        with self._db.lock:
            conn = self._conn()
            with write_txn(conn, "<metadata>"):
                conn.execute("INSERT INTO metadata (key, value) VALUES (?, ?) ON CONFLICT (key) "
                             "DO UPDATE SET value = excluded.value", (key, value))

    def get_metadata(self, key: str) -> str | None:
        with self._db.lock:
            row = self._conn().execute("SELECT value FROM metadata WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def commit_position(self, channel: str, subscription: str, msg_id: MessageID) -> None:
        with self._db.lock:
            conn = self._conn()
            with write_txn(conn, channel):
                conn.execute("INSERT INTO subscriptions (sub, channel, cursor) VALUES (?, ?, ?) "
                             "ON CONFLICT (sub, channel) DO UPDATE SET cursor = excluded.cursor",
                             (subscription, channel, msg_id.offset))

    def apply_retention(self, channel: str | None = None) -> int:
        """Apply age and size retention now; returns the number of messages removed."""
        with self._db.lock:
            return apply_retention(self._conn(), self.settings, channel)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
