"""A seeded generator of corrupt Milvus payloads, and an oracle of its own that says which are bad.

Kinds (issue 12): truncated, bit-flipped, wrong ``msg_type`` property, valid protobuf of the
wrong type, a field count that disagrees with ``num_rows``, a float vector whose length is not a
multiple of ``dim``. A mutation the oracle still finds well-formed (a flipped bit inside a float,
say) is drawn again, so every payload handed out is bad and none of its rows may appear.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.pb import common_pb2, msg_pb2
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg

KINDS = ("truncated", "bitflip", "wrong_msg_type", "wrong_protobuf", "rowcount", "vector_dim")
DIM = 4
T = common_pb2.MsgType


@dataclass
class BadPayload:
    kind: str
    payload: bytes
    properties: dict


def insert_msg(first_pk: int, n: int, ts: int, msg_id: int) -> InsertMsg:
    """A valid insert (pk, vec[DIM], name) of pks first_pk..first_pk+n-1."""
    pks = np.arange(first_pk, first_pk + n, dtype=np.int64)
    fds = [
        arrow_to_field_data(pa.array(pks), field_schema_from_arrow("pk", pa.int64(), field_id=100,
                                                                 is_primary_key=True)),
        arrow_to_field_data(pa.array((pks[:, None] * 10 + np.arange(DIM)).astype(np.float32).tolist(),
                                     pa.list_(pa.float32())),
                            field_schema_from_arrow("vec", pa.list_(pa.float32()), field_id=101, dim=DIM)),
        arrow_to_field_data(pa.array([f"n{p}" for p in pks]), field_schema_from_arrow("name", pa.string(),
                                                                                      field_id=102)),
    ]
    return InsertMsg.build(fields_data=fds, num_rows=n, timestamp=ts, collection_id=77, partition_id=1,
                           msg_id=msg_id, shard_name="bad_77v0", collection_name="coll")


def _rows(fd) -> int | None:
    """Rows of one FieldData by the oracle's own reading, None when it cannot hold whole rows."""
    kind = fd.WhichOneof("field")
    if kind == "scalars":
        sc = fd.scalars
        which = sc.WhichOneof("data")
        return len(getattr(sc, which).data) if which else 0
    if kind == "vectors":
        v = fd.vectors
        if v.WhichOneof("data") != "float_vector" or v.dim <= 0 or len(v.float_vector.data) % v.dim:
            return None
        return len(v.float_vector.data) // v.dim
    return None


def oracle_ok(payload: bytes, properties: dict) -> bool:
    """False only when the payload is clearly bad: it does not parse as the type its ``msg_type``
    property names, its header names another type, or its counts disagree (``num_rows``, timestamps,
    row ids, a field's values, a vector not a whole number of ``dim``). A mutation that yields another
    well-formed message (a renamed field, an empty insert) counts as good, and the generator draws again."""
    name = properties.get("msg_type")
    cls = {"Insert": msg_pb2.InsertRequest, "Delete": msg_pb2.DeleteRequest}.get(name)
    if cls is None:
        return False
    req = cls()
    try:
        req.ParseFromString(payload)
    except Exception:  # noqa: BLE001 - any parse failure means bad
        return False
    if req.base.msg_type != T.Value(name):
        return False
    n = int(req.num_rows)
    if name == "Delete":
        return len(req.timestamps) == n and len(req.primary_keys.int_id.data) == n
    if len(req.timestamps) != n or len(req.rowIDs) != n or (req.version != 1 and len(req.row_data)):
        return False
    return all(_rows(fd) == n for fd in req.fields_data)


class Generator:
    """Draws corrupt payloads of every kind in turn; bad pks start at ``BAD_PK0`` so none can pass for a valid row."""

    BAD_PK0 = 1_000_000_000

    def __init__(self, seed: int, rows: int = 5) -> None:
        self.rnd = random.Random(seed)
        self.rows = rows
        self.next_pk = self.BAD_PK0
        self.msg_id = 10_000_000

    def _insert(self) -> tuple[bytes, dict, InsertMsg]:
        self.msg_id += 1
        msg = insert_msg(self.next_pk, self.rows, ts=(1 << 40) + self.msg_id, msg_id=self.msg_id)
        self.next_pk += self.rows
        payload, props = codec.marshal(msg)
        return payload, props, msg

    def draw(self, kind: str) -> BadPayload:
        for _ in range(500):
            payload, props = getattr(self, f"_{kind}")()
            if not oracle_ok(payload, props):
                return BadPayload(kind, payload, props)
        raise AssertionError(f"no bad {kind} payload in 500 draws")

    def batch(self, n: int) -> list[BadPayload]:
        return [self.draw(KINDS[i % len(KINDS)]) for i in range(n)]

    def _truncated(self):
        payload, props, _ = self._insert()
        return payload[: self.rnd.randrange(0, len(payload))], props

    def _bitflip(self):
        payload, props, _ = self._insert()
        b = bytearray(payload)
        for _ in range(self.rnd.randint(1, 3)):
            i = self.rnd.randrange(len(b))
            b[i] ^= 1 << self.rnd.randrange(8)
        return bytes(b), props

    def _wrong_msg_type(self):
        if self.rnd.random() < 0.5:
            payload, props, _ = self._insert()
            return payload, {**props, "msg_type": "Delete"}
        self.msg_id += 1
        d = DeleteMsg.build(primary_keys=np.arange(self.next_pk, self.next_pk + 3, dtype=np.int64),
                            timestamp=(1 << 40) + self.msg_id, collection_id=77, msg_id=self.msg_id)
        self.next_pk += 3
        payload, props = codec.marshal(d)
        return payload, {**props, "msg_type": "Insert"}

    def _wrong_protobuf(self):
        """Another Milvus message, well-formed, labelled (property and all) as an Insert."""
        self.msg_id += 1
        pick = self.rnd.randrange(3)
        if pick == 0:
            other = TimeTickMsg.build((1 << 40) + self.msg_id).proto
        elif pick == 1:
            other = msg_pb2.CreateCollectionRequest(base=common_pb2.MsgBase(msg_type=T.CreateCollection),
                                                    collectionName="coll", collectionID=77)
        else:
            other = msg_pb2.DataNodeTtMsg(base=common_pb2.MsgBase(msg_type=T.DataNodeTt), channel_name="c",
                                          timestamp=self.msg_id)
        return other.SerializeToString(), {"msg_type": "Insert"}

    def _rowcount(self):
        _, props, msg = self._insert()
        req = msg.proto
        if self.rnd.random() < 0.5:  # num_rows (with timestamps and rowIDs) disagrees with the fields
            extra = self.rnd.choice([-2, -1, 1, 3])
            n = self.rows + extra
            req.num_rows = n
            del req.timestamps[:]
            req.timestamps.extend([req.base.timestamp] * n)
            del req.rowIDs[:]
            req.rowIDs.extend(range(n))
        else:  # one field loses or gains values
            fd = req.fields_data[self.rnd.choice([0, 2])]
            data = fd.scalars.long_data.data if fd.field_id == 100 else fd.scalars.string_data.data
            if self.rnd.random() < 0.5:
                del data[-1]
            else:
                data.append(data[0])
        return req.SerializeToString(), props

    def _vector_dim(self):
        _, props, msg = self._insert()
        vec = msg.proto.fields_data[1].vectors.float_vector.data
        cut = self.rnd.randint(1, DIM - 1)
        if self.rnd.random() < 0.5:
            del vec[-cut:]
        else:
            vec.extend([0.5] * cut)
        return msg.proto.SerializeToString(), props
