"""Read back what the sink wrote in the 2.6 format, as a Milvus 2.6 consumer applies it.

Written from ../shared/docs/milvus-26-wal-format.md and docs/sink-jobs-cli.md ("Exactly-once"),
as tests/wal26/producer.py is, so the sink's output is checked by a reader that is not the
product's: per channel, in broker order,

1. replays: a message whose (writer, batch, task, seq) keys were already seen on the channel is
   dropped (the sink writes a retried or replayed message again with the same keys);
2. the envelope from the properties (``_v``, ``_t``, ``_tt`` in base 36, ``_vc``, ``_tx`` and
   ``_h`` decoded with this module's own protobuf field reader);
3. Milvus's time-tick rule (wal doc §6): a message whose ``_tt`` is below the last TimeTick seen
   is dropped and counted in ``violations``;
4. transactions (wal doc §5): bodies are held by ``txn_id`` and applied at their CommitTxn with
   the commit's ``_tt``, dropped at a RollbackTxn or once a TimeTick passes the keepalive;
5. version-1 bodies parsed with Milvus's generated ``msgpb`` classes and rebuilt from the
   properties as Milvus's adaptor does (wal doc §3); a body without ``_v`` is a 2.5 message read
   with its own values.

What it shares with the product: the backend SPI to fetch the raw messages (a transport), the
generated protobuf classes, and :func:`rows`' conversion of ``FieldData`` columns to Python values
(``msgstream_spark.msg.columns``): the values of exotic types are checked by the 2.5 sink tests,
not here.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.mq.base import SubscriptionInitialPosition
from msgstream_spark.msg.columns import field_data_to_arrow
from msgstream_spark.msg.pb import msg_pb2
from tests.wal26.producer import T

NAMES = {v: k for k, v in T.items()}
KEYS = ("msgstream.writer", "msgstream.batch", "msgstream.task", "msgstream.seq")
_INSERT_25, _DELETE_25, _TICK_25 = 400, 401, 1200  # commonpb.MsgType


def raw_messages(client, channel: str, timeout: float = 30.0) -> list:
    """Every message of ``channel`` up to its latest id (bounded by ``timeout``)."""
    last = client.latest_message_id(channel)
    if last is None:
        return []
    out: list = []
    deadline = time.monotonic() + timeout
    with client.subscribe(channel, f"t26-{uuid.uuid4().hex[:8]}", SubscriptionInitialPosition.EARLIEST) as cons:
        while time.monotonic() < deadline:
            out.extend(cons.receive_batch(1024, 1.0))
            if out and out[-1].id >= last:
                return out
    raise AssertionError(f"reading {channel} did not reach its latest message within {timeout}s")


# -- protobuf fields, read by hand -----------------------------------------------------------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return value, i


def fields(data: bytes) -> list[tuple[int, Any]]:
    """(field number, value) of varint and length-delimited fields, in order."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        if key & 7 == 0:
            value, i = _varint(data, i)
        elif key & 7 == 2:
            n, i = _varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {key & 7} in {data.hex()}")
        out.append((key >> 3, value))
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def segment_of(header: bytes, partition_id: int) -> int:
    """InsertMessageHeader{2: [PartitionSegmentAssignment{1 partition_id, 4 {1 segment_id}}]}."""
    for num, part in fields(header):
        if num == 2:
            p = dict(fields(part))
            if _signed(p.get(1, 0)) == partition_id:
                return dict(fields(p.get(4, b""))).get(1, 0)
    return 0


# -- the messages a consumer applies -----------------------------------------------------------------
@dataclass
class Msg:
    """One applied message: its type name, properties, time tick and (for inserts/deletes) body."""

    kind: str
    properties: dict
    tt: int
    proto: Any = None

    @property
    def timestamps(self) -> list[int]:
        return list(self.proto.timestamps) if self.proto is not None else []

    @property
    def shard_name(self) -> str:
        return self.proto.shardName if self.proto is not None else ""


class InsertMsg(Msg):
    pass


class DeleteMsg(Msg):
    pass


def decode(payload: bytes, props: dict) -> Msg:
    """A 2.6 message rebuilt from its properties (wal doc §3), or a 2.5 one with its body's values."""
    if "_v" not in props:
        base = msg_pb2.TimeTickMsg.FromString(payload).base  # every msgpb body starts with its MsgBase
        if base.msg_type == _INSERT_25:
            req = msg_pb2.InsertRequest.FromString(payload)
            return InsertMsg("Insert", props, min(req.timestamps, default=0), req)
        if base.msg_type == _DELETE_25:
            req = msg_pb2.DeleteRequest.FromString(payload)
            return DeleteMsg("Delete", props, min(req.timestamps, default=0), req)
        return Msg("TimeTick" if base.msg_type == _TICK_25 else str(base.msg_type), props, base.timestamp)
    kind, tt = NAMES.get(int(props["_t"]), props["_t"]), int(props["_tt"], 36)
    if props["_v"] != "1" or kind not in ("Insert", "Delete"):
        return Msg(kind, props, tt)
    header = base64.b64decode(props.get("_h", ""))
    if kind == "Insert":
        req = msg_pb2.InsertRequest.FromString(payload)
        req.segmentID = segment_of(header, req.partitionID)
        assert req.segmentID, f"_h assigns no segment to partition {req.partitionID}: Milvus drops it as corrupt"
        req.base.timestamp = tt
        out: Msg = InsertMsg(kind, props, tt, req)
    else:
        req = msg_pb2.DeleteRequest.FromString(payload)
        out = DeleteMsg(kind, props, tt, req)
    retime(out, tt)
    req.shardName = props.get("_vc", "")
    return out


def retime(m: Msg, tt: int) -> None:
    """Every row at ``tt`` (and an insert's ``base.timestamp``)."""
    m.tt = tt
    if m.proto is not None:
        n = len(m.proto.timestamps)
        del m.proto.timestamps[:]
        m.proto.timestamps.extend([tt] * n)
        if m.kind == "Insert":
            m.proto.base.timestamp = tt


@dataclass
class Transactions:
    """Open transactions of one channel (wal doc §5) and what became of the others."""

    open: dict[int, dict] = field(default_factory=dict)  # txn_id -> {"keepalive", "last_tt", "bodies"}
    stats: dict[str, int] = field(default_factory=lambda: {"committed": 0, "rolled_back": 0, "expired": 0})

    @property
    def has_open(self) -> bool:
        return bool(self.open)

    def feed(self, m: Msg) -> list[Msg]:
        """What ``m`` releases: itself outside a transaction, a committed transaction's bodies, or nothing."""
        if m.kind == "TimeTick":
            for txn_id, t in list(self.open.items()):
                if t["keepalive"] != -1000 and m.tt >= t["last_tt"] + (t["keepalive"] << 18):
                    del self.open[txn_id]
                    self.stats["expired"] += 1
        if "_tx" not in m.properties:
            return [m]
        ctx = dict(fields(base64.b64decode(m.properties["_tx"])))
        txn_id, keepalive = _signed(ctx.get(1, 0)), _signed(ctx.get(2, 0)) or 10_000
        if m.kind == "BeginTxn":
            self.open[txn_id] = {"keepalive": keepalive, "last_tt": m.tt, "bodies": []}
            return []
        t = self.open.get(txn_id)
        if t is None:
            return []  # expired, or its Begin was never seen: ignored
        if m.kind == "CommitTxn":
            del self.open[txn_id]
            self.stats["committed"] += 1
            for body in t["bodies"]:
                retime(body, m.tt)
            return t["bodies"]
        if m.kind == "RollbackTxn":
            del self.open[txn_id]
            self.stats["rolled_back"] += 1
            return []
        t["bodies"].append(m)
        t["last_tt"] = m.tt
        return []


@dataclass
class Applied:
    """What a 2.6 consumer applies from some channels."""

    raw: dict[str, list] = field(default_factory=dict)
    msgs: dict[str, list] = field(default_factory=dict)  # released messages per channel
    assemblers: dict[str, Transactions] = field(default_factory=dict)
    replays_dropped: int = 0
    violations: int = 0  # messages below the last TimeTick: a Milvus consumer drops them

    def rows(self) -> list[dict]:
        out = []
        for msgs in self.msgs.values():
            for m in msgs:
                if isinstance(m, InsertMsg):
                    cols = {fd.field_name: field_data_to_arrow(fd).to_pylist() for fd in m.proto.fields_data}
                    out.extend({k: v[i] for k, v in cols.items()} for i in range(int(m.proto.num_rows)))
        return out

    def deleted(self) -> list:
        out = []
        for msgs in self.msgs.values():
            for m in msgs:
                if isinstance(m, DeleteMsg):
                    ids = m.proto.primary_keys
                    out.extend(ids.int_id.data if ids.HasField("int_id") else ids.str_id.data)
        return out

    def types(self, channel: str) -> list[str]:
        """The ``_t`` names of the raw messages of ``channel`` in broker order."""
        return [NAMES[int(m.properties["_t"])] for m in self.raw[channel]]


def apply(client, channels, *, dedupe: bool = True) -> Applied:
    got = Applied()
    for ch in channels:
        got.raw[ch] = raw_messages(client, ch)
        txns = got.assemblers[ch] = Transactions()
        out, last_tick, seen = [], 0, set()
        for raw in got.raw[ch]:
            props = dict(raw.properties)
            key = tuple(props.get(k) for k in KEYS)
            if dedupe and key[0] is not None:
                if key in seen:
                    got.replays_dropped += 1
                    continue
                seen.add(key)
            m = decode(raw.payload, props)
            if "_v" in props and m.kind == "TimeTick" and "_vc" not in props:
                last_tick = max(last_tick, m.tt)
            elif "_v" in props and m.tt < last_tick:
                got.violations += 1
                continue
            out.extend(txns.feed(m))
        got.msgs[ch] = out
    return got
