"""Read back what the sink wrote in the 2.6 format, as a Milvus 2.6 consumer applies it.

Per channel, in broker order: the exactly-once ``ReplayFilter`` (on the raw properties), then
``wal26.decode_message``, then Milvus's time-tick rule (wal doc §6: a message whose ``_tt`` is below
the last TimeTick seen is dropped, counted in ``violations``), then a ``TxnAssembler`` (bodies only
at their CommitTxn, dropped at a RollbackTxn or at keepalive expiry). Independent of the product's
stream layer.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from msgstream_spark.mq.base import SubscriptionInitialPosition
from msgstream_spark.msg.columns import field_data_to_arrow
from msgstream_spark.msg.types import DeleteMsg, InsertMsg
from msgstream_spark.msg.wal26 import decode_message
from msgstream_spark.sink.dedupe import ReplayFilter
from msgstream_spark.stream.txn import TxnAssembler


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


@dataclass
class Applied:
    """What a 2.6 consumer applies from some channels."""

    raw: dict[str, list] = field(default_factory=dict)
    msgs: dict[str, list] = field(default_factory=dict)  # released messages per channel
    assemblers: dict[str, TxnAssembler] = field(default_factory=dict)
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
        from msgstream_spark.msg.wal26 import type_name

        return [type_name(int(m.properties["_t"])) for m in self.raw[channel]]


def apply(client, channels, *, dedupe: bool = True) -> Applied:
    got = Applied()
    f = ReplayFilter()
    for ch in channels:
        got.raw[ch] = raw_messages(client, ch)
        asm = got.assemblers[ch] = TxnAssembler()
        out, last_tick = [], 0
        for m in got.raw[ch]:
            if dedupe and not f.keep(ch, m.properties):
                continue
            msg = decode_message(m.payload, m.properties, channel=ch, msg_id=m.id.serialize())
            if msg.wal is not None and msg.wal.msg_type == 1 and msg.wal.vchannel is None:
                last_tick = max(last_tick, msg.wal.time_tick)
            elif msg.wal is not None and msg.wal.time_tick < last_tick:
                got.violations += 1
                continue
            out.extend(asm.feed(msg))
        got.msgs[ch] = out
    got.replays_dropped = f.dropped
    return got
