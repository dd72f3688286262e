"""Publishing test collections straight through the codec and the backend SPI."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from msgstream_spark.config.loader import DEFAULTS
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg

TS0 = 455000614502400000  # 2025-01-01T00:00:00Z
MS = 1 << 18
COLLECTION = 4242


def spark_options(env) -> dict[str, str]:
    """The backend's config as Spark options (keys that differ from the defaults)."""
    return {k: str(v) for k, v in env.config.values.items() if DEFAULTS.get(k) != v}


@dataclass
class Publisher:
    """Writes inserts/deletes of a small collection (pk, vec[4], name nullable) with time ticks."""

    client: object
    channels: list[str]
    ts: int = TS0
    msg_id: int = 0
    next_pk: int = 0
    producers: dict = field(default_factory=dict)
    published: list = field(default_factory=list)  # (op, pk, channel)

    def _p(self, ch):
        if ch not in self.producers:
            self.producers[ch] = self.client.create_producer(ch)
        return self.producers[ch]

    def send(self, ch, msg) -> None:
        payload, props = codec.marshal(msg)
        self._p(ch).send(ProducerMessage(payload, props, timestamp=msg.end_ts))

    def insert(self, ch: str, n: int) -> list[int]:
        self.ts += MS
        self.msg_id += 1
        pks = np.arange(self.next_pk, self.next_pk + n, dtype=np.int64)
        self.next_pk += n
        fds = [
            arrow_to_field_data(pa.array(pks), field_schema_from_arrow("pk", pa.int64(), field_id=100,
                                                                     is_primary_key=True)),
            arrow_to_field_data(pa.array((pks[:, None] + np.arange(4)).astype(np.float32).tolist(),
                                         pa.list_(pa.float32())),
                                field_schema_from_arrow("vec", pa.list_(pa.float32()), field_id=101, dim=4)),
            arrow_to_field_data(pa.array([None if p % 5 == 0 else f"n{p}" for p in pks]),
                                field_schema_from_arrow("name", pa.string(), field_id=102, nullable=True)),
        ]
        self.send(ch, InsertMsg.build(fields_data=fds, num_rows=n, timestamp=self.ts, collection_id=COLLECTION,
                                      partition_id=1, msg_id=self.msg_id, shard_name=f"{ch}_{COLLECTION}v0",
                                      collection_name="coll"))
        self.published += [("insert", int(p), ch) for p in pks]
        return pks.tolist()

    def delete(self, ch: str, pks: list[int]) -> None:
        self.ts += MS
        self.msg_id += 1
        self.send(ch, DeleteMsg.build(primary_keys=np.asarray(pks, np.int64), timestamp=self.ts,
                                      collection_id=COLLECTION, msg_id=self.msg_id, shard_name=f"{ch}_{COLLECTION}v0"))
        self.published += [("delete", int(p), ch) for p in pks]

    def tick(self) -> None:
        self.ts += MS
        for ch in self.channels:
            self.send(ch, TimeTickMsg.build(self.ts))

    def rounds(self, k: int, rows: int = 10) -> None:
        """k rounds of one insert per channel followed by a tick on every channel."""
        for _ in range(k):
            for ch in self.channels:
                self.insert(ch, rows)
            self.tick()

    def close(self) -> None:
        for p in self.producers.values():
            p.close()
        self.producers.clear()
