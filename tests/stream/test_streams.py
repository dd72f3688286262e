"""MsgStream (hash repack, broadcast, plain consume) and TtMsgStream (tick-aligned packs, seek)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.hashing import shard_indices
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgPack, MsgType, TimeTickMsg
from msgstream_spark.stream import Factory, to_physical_channel, vchannel_name

PK = field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True)


def insert(pks, ts, msg_id, shard=""):
    pks = np.asarray(pks, dtype=np.int64)
    fd = arrow_to_field_data(pa.array(pks), PK)
    return InsertMsg.build(fields_data=[fd], num_rows=len(pks), timestamp=ts, msg_id=msg_id, shard_name=shard,
                           hash_values=shard_indices(pks, 1 << 30))


@pytest.fixture
def factory(tmp_path):
    return Factory({"mq": {"type": "local"}, "local": {"path": str(tmp_path / "log.db")}})


def test_produce_routes_by_milvus_hash_and_broadcast_reaches_all(factory):
    chans = ["dml_0", "dml_1"]
    with factory.msgstream() as out:
        out.as_producer(chans)
        # whole message goes to the channel of its first hash value (pk 103 -> shard 1, pk 100 -> 0)
        ids = out.produce(MsgPack([insert([103], 10, 1), insert([100], 10, 2)]))
        assert {ch: len(v) for ch, v in ids.items()} == {"dml_0": 1, "dml_1": 1}
        b = out.broadcast(MsgPack([TimeTickMsg.build(20)]))
        assert sorted(b) == chans
    with factory.msgstream() as inp:
        inp.as_consumer(chans, "plain", "earliest")
        packs = list(inp.iterate(timeout=0.5))
    got = {(p.start_positions[0].channel_name, p.msgs[0].msg_type, p.msgs[0].base_msg_id) for p in packs}
    assert got == {("dml_1", MsgType.Insert, 1), ("dml_0", MsgType.Insert, 2),
                   ("dml_0", MsgType.TimeTick, 0), ("dml_1", MsgType.TimeTick, 0)}
    assert all(p.start_positions[0].msg_group == "plain" for p in packs)


def _write_ticked(factory, chans):
    """Channel 0: I(ts 5) T10 I(ts 15) T20; channel 1: I(ts 7) T10 T20 D(ts 25) T30."""
    with factory.client() as c:
        def send(ch, m):
            from msgstream_spark.msg import codec

            payload, props = codec.marshal(m)
            with c.create_producer(ch) as p:
                p.send(ProducerMessage(payload, props, timestamp=m.end_ts))
        send(chans[0], insert([1], 5, 1))
        send(chans[1], insert([2], 7, 2))
        for ch in chans:
            send(ch, TimeTickMsg.build(10))
        send(chans[0], insert([3], 15, 3))
        send(chans[0], insert([3], 15, 3))  # a duplicate msgID within one pack is dropped
        for ch in chans:
            send(ch, TimeTickMsg.build(20))
        send(chans[1], DeleteMsg.build(primary_keys=[2], timestamp=25, msg_id=4))
        send(chans[1], TimeTickMsg.build(30))


def test_tt_stream_cuts_packs_at_common_ticks_and_resumes_from_end_positions(factory):
    chans = ["a_0", "a_1"]
    _write_ticked(factory, chans)
    with factory.tt_msgstream() as s:
        s.as_consumer(chans, "tt", "earliest")
        p1 = s.consume(timeout=2)
        assert (p1.begin_ts, p1.end_ts) == (0, 10)
        assert sorted(m.base_msg_id for m in p1.msgs) == [1, 2]
        p2 = s.consume(timeout=2)
        assert p2.end_ts == 20 and [m.base_msg_id for m in p2.msgs] == [3]
        saved = p2.end_positions
        assert s.consume(timeout=0.3) is None  # channel a_0 has no tick beyond 20 yet
    assert {p.channel_name for p in saved} == set(chans) and all(p.timestamp == 20 for p in saved)
    with factory.client() as c, c.create_producer("a_0") as p:
        from msgstream_spark.msg import codec

        p.send(ProducerMessage(*codec.marshal(TimeTickMsg.build(30)), timestamp=30))
    # a new stream seeking to the saved positions continues exactly after pack 2
    with factory.tt_msgstream() as s:
        s.as_consumer(chans, "tt-resume", "unknown")
        s.seek(saved)
        p3 = s.consume(timeout=2)
        assert p3.end_ts == 30
        assert [(m.msg_type, m.base_msg_id) for m in p3.msgs] == [(MsgType.Delete, 4)]


def test_decode_errors_fail_or_skip(factory):
    with factory.client() as c, c.create_producer("bad") as p:
        p.send(ProducerMessage(b"\x0a\x03\x08", {"msg_type": "Insert"}))
        from msgstream_spark.msg import codec

        p.send(ProducerMessage(*codec.marshal(TimeTickMsg.build(9))))
    with factory.msgstream() as s:
        s.as_consumer(["bad"], "f", "earliest")
        with pytest.raises(DecodeError, match="channel=bad"):
            s.consume(timeout=1)
    with factory.msgstream(on_decode_error="skip") as s:
        s.as_consumer(["bad"], "s", "earliest")
        pack = s.consume(timeout=1)
        assert pack.msgs[0].msg_type == MsgType.TimeTick and len(s.skipped) == 1


def test_channel_names():
    v = vchannel_name("by-dev-rootcoord-dml_3", 449, 0)
    assert v == "by-dev-rootcoord-dml_3_449v0"
    assert to_physical_channel(v) == "by-dev-rootcoord-dml_3"
    assert to_physical_channel("by-dev-rootcoord-dml_3") == "by-dev-rootcoord-dml_3"
