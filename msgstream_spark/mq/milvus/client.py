"""MilvusClient: a read-only backend over a Milvus 2.6 proxy's ``DumpMessages`` (config ``milvus.*``).

Channels are pchannels. With ``milvus.collections`` the client finds their pchannels with
``DescribeCollection`` and its consumers keep only those collections' vchannels (plus the control
vchannel and pchannel-wide entries); without it, name pchannels directly. Nothing is written to
the cluster: metadata and subscription cursors live in a local file (metadata.py). ``latest`` is
the last message at or below the proxy's TSO when asked (scan.py).
"""

from __future__ import annotations

import base64
import threading
import uuid

from msgstream_spark.config import Config
from msgstream_spark.errors import ConfigError, DecodeError, ProduceError
from msgstream_spark.mq.base import Client, Consumer, MessageID, Producer, SubscriptionInitialPosition
from msgstream_spark.mq.milvus import scan
from msgstream_spark.mq.milvus.channels import CollectionChannels, describe, describe_schema
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.consumer import MilvusConsumer
from msgstream_spark.mq.milvus.message_id import MilvusMessageID, earliest_for, from_legacy
from msgstream_spark.mq.milvus.metadata import MetadataFile
from msgstream_spark.mq.milvus.settings import MilvusSettings

_READER = "__msgstream-reader-"


class MilvusClient(Client):
    name = "milvus"
    time_ordered = True  # the proxy sends by _tt (a transaction at its Commit's) and never a TimeTick

    def __init__(self, config: Config) -> None:
        self.settings = MilvusSettings(config)
        self._conn = ProxyConnection(self.settings)
        self._meta = MetadataFile(self.settings.metadata_path)
        self._collections: list[CollectionChannels] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"MilvusClient({self.settings.describe()})"

    @property
    def wal_name(self):
        """The WAL name ids are read with (``milvus.wal``; Unknown = the cluster's own)."""
        return self.settings.wal

    # -- collections -----------------------------------------------------------------------------
    def collections(self) -> list[CollectionChannels]:
        """The configured collections with their pchannels and vchannels (``DescribeCollection``)."""
        with self._lock:
            if self._collections is None:
                self._collections = [describe(self._conn, db, name) for db, name in self.settings.collections]
            return self._collections

    def collection_schema(self, collection: str | None) -> tuple[bytes, int] | None:
        """The schema ``DescribeCollection`` gives for one of the configured collections (``milvus.collections``;
        ``None`` names the only one); ``None`` for any other, or an answer without schema fields."""
        chosen = [c for c in self.collections()
                  if collection is None or collection in (c.collection, str(c.collection_id))]
        if len(chosen) != 1:
            return None
        return describe_schema(self._conn, chosen[0].database, chosen[0].collection)

    def _vchannels(self, channel: str) -> frozenset[str] | None:
        if not self.settings.collections:
            return None
        return frozenset(v for c in self.collections() for v in c.vchannels if v.startswith(channel + "_"))

    # -- SPI -------------------------------------------------------------------------------------
    def create_producer(self, channel: str) -> Producer:
        raise ProduceError(f"the milvus backend is read-only (it reads the WAL through the proxy's DumpMessages); "
                           f"cannot write channel {channel}: write with mq.type=kafka, pulsar or local",
                           channel=channel)

    def subscribe(self, channel: str, subscription: str,
                  initial_position: SubscriptionInitialPosition = SubscriptionInitialPosition.EARLIEST) -> Consumer:
        self._check_name(channel)
        pos = SubscriptionInitialPosition.parse(initial_position)
        cons = MilvusConsumer(self._conn, channel, subscription, vchannels=self._vchannels(channel),
                              on_close=self._consumer_closed, latest=self.latest_message_id,
                              ticks=self.settings.time_ticks and not subscription.startswith(_READER))
        stored = None if subscription.startswith(_READER) else self._meta.get(self._sub_key(channel, subscription))
        if stored:
            cons.seek(MilvusMessageID.deserialize(base64.b64decode(stored)), inclusive=False)
        elif pos == SubscriptionInitialPosition.EARLIEST:
            cons.seek(self.earliest_message_id(), inclusive=True)
        elif pos == SubscriptionInitialPosition.LATEST:
            last = self.latest_message_id(channel)
            cons.seek(last or self.earliest_message_id(), inclusive=last is None)
        return cons

    def reader(self, channel: str) -> Consumer:
        """A throwaway reader: no cursor kept, and no synthetic ticks (it reads up to an id, not a tick)."""
        return self.subscribe(channel, f"{_READER}{uuid.uuid4().hex[:12]}", SubscriptionInitialPosition.UNKNOWN)

    @staticmethod
    def _sub_key(channel: str, subscription: str) -> str:
        return f"subscription/{channel}/{subscription}"

    def _consumer_closed(self, cons: MilvusConsumer, forget: bool) -> None:
        if cons.subscription.startswith(_READER):
            return
        key = self._sub_key(cons.channel, cons.subscription)
        if forget:
            self._meta.delete(key)
        elif cons.acked is not None:
            self._meta.put(key, base64.b64encode(cons.acked.serialize()).decode())

    @staticmethod
    def _check_name(channel: str) -> None:
        if not channel or not isinstance(channel, str):
            raise ConfigError(f"invalid pchannel name {channel!r}")

    def earliest_message_id(self) -> MessageID:
        return earliest_for(self.settings.wal)

    def bytes_to_message_id(self, data: bytes) -> MessageID:
        """A serialized ``common.MessageID``, or the legacy ``MsgPosition.msgID`` bytes of the cluster's WAL."""
        try:
            return MilvusMessageID.deserialize(data)
        except DecodeError:
            legacy = from_legacy(self.settings.wal, bytes(data))
            if legacy is None:
                raise
            return legacy

    def latest_message_id(self, channel: str) -> MessageID | None:
        return scan.latest_id(self._conn, channel, self._vchannels(channel))

    def first_message_id(self, channel: str) -> MessageID | None:
        return scan.first_id(self._conn, channel, self._vchannels(channel))

    def message_id_at_timestamp(self, channel: str, hybrid_ts: int) -> MessageID | None:
        return scan.id_at_timestamp(self._conn, channel, self._vchannels(channel), hybrid_ts)

    def list_channels(self) -> list[str]:
        if not self.settings.collections:
            raise ConfigError("the milvus backend finds channels through collections: set milvus.collections "
                              "(db.collection names, or a JSON map of database -> collections), or name the "
                              "pchannels")
        return sorted({p for c in self.collections() for p in c.pchannels})

    def channel_exists(self, channel: str) -> bool:
        """With collections: one of their pchannels. Without, a named pchannel is taken as given (the proxy
        cannot tell: it keeps an unknown pchannel's stream open and silent, so its scans time out)."""
        return channel in self.list_channels() if self.settings.collections else bool(channel)

    def put_metadata(self, key: str, value: str) -> None:
        self._meta.put(f"metadata/{key}", value)

    def get_metadata(self, key: str) -> str | None:
        return self._meta.get(f"metadata/{key}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conn.close()
