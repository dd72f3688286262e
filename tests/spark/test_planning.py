"""The source's driver-side planning without Spark: offsets, ranges, the tick cut, options."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import OptionError
from msgstream_spark.source.offsets import ChannelOffset, entry, normalize
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.ranges import plan_ranges
from msgstream_spark.source.scan import Scanner
from tests.spark.helpers import Publisher, spark_options


def ids(client, *offsets):
    return [client.message_id_from_offset(o).serialize() for o in offsets]


def test_channel_offset_round_trips_the_json_entry():
    for e in ({"msgID": "", "ts": 0}, entry(b"\x01" * 8, 5, inclusive=True), entry(b"\x02" * 8, 7, exclusive=True)):
        assert ChannelOffset.from_json(e).to_json() == e
    assert ChannelOffset.from_json(entry(b"x", 3, inclusive=True)) == ChannelOffset(b"x", 3, inclusive=True)


def test_ranges_split_only_where_ids_are_offsets(local_env):
    with local_env.client() as c:
        a0, a100, b10 = ids(c, 0, 100, 10)
        start = normalize({"a": entry(a0, 0), "b": entry(a0, 0), "c": entry(b"", 0)})
        end = normalize({"a": entry(a100, 9), "b": entry(b10, 4), "c": entry(b"", 0)})
        assert [(ch, s.msg_id, e.msg_id) for ch, s, e in plan_ranges(c, start, end, None)] == [
            ("a", a0, a100), ("b", a0, b10)]  # c has nothing to read
        split = plan_ranges(c, start, end, 11)
        per = {}
        for ch, s, e in split:
            off = c.bytes_to_message_id
            per.setdefault(ch, []).append((off(s.msg_id).offset, off(e.msg_id).offset, e.ts))
        assert len(per["a"]) == 10 and per["a"][0][0] == 0 and per["a"][-1][1:] == (100, 9)
        assert all(x[1] == y[0] for x, y in zip(per["a"], per["a"][1:]))  # contiguous pieces
        assert per["b"] == [(0, 10, 4)]
        inclusive = normalize({"a": entry(a0, 0, inclusive=True)})
        assert len(plan_ranges(c, inclusive, normalize({"a": entry(a100, 9)}), 11)) == 1  # a seek is one piece


def test_ranges_are_never_split_without_integer_offsets(pulsar_env):
    with pulsar_env.client() as c:
        assert c.message_id_from_offset(0) is None


def test_scanner_plan_end_cuts_at_a_tick_every_channel_reached(local_env):
    client = local_env.client()
    chans = [local_env.new_channel("plan"), local_env.new_channel("plan")]
    pub = Publisher(client, chans)
    pub.rounds(2, rows=3)
    pub.insert(chans[0], 3)  # pending after the last tick: not in the batch
    pub.close()
    scan = Scanner(client, "rows", True)
    try:
        start = normalize({ch: entry(b"", 0) for ch in chans})
        scan.refresh(start)
        end, rows = scan.plan_end(start, align=None)
        assert rows == 12
        assert all(e["ts"] == end[chans[0]]["ts"] for e in end.values())  # both end at the same tick
        end1, rows1 = scan.plan_end(start, align=None, max_rows=6)
        assert rows1 == 6 and end1[chans[0]]["ts"] < end[chans[0]]["ts"]
    finally:
        scan.close()
        client.close()


def test_read_options(local_env):
    base = {**spark_options(local_env), "channels": "a,b"}
    r = parse_read_options(base, streaming=False)
    assert r.channels == ("a", "b") and r.output == "rows"
    with pytest.raises(OptionError, match="readTimeout"):
        parse_read_options({**base, "readTimeout": "-1"}, streaming=False)
    with pytest.raises(OptionError, match="readTimeout"):
        parse_read_options({**base, "readTimeout": "soon"}, streaming=False)
    assert parse_read_options({**base, "readTimeout": "2.5"}, streaming=False).read_timeout == 2.5
    with pytest.raises(OptionError, match="subscription is required"):
        parse_read_options(base, streaming=True)
    with pytest.raises(OptionError, match="exactly one of"):
        parse_read_options({**base, "channelPattern": "x.*"}, streaming=None)
    with pytest.raises(OptionError, match="messageTypes"):
        parse_read_options({**base, "messageTypes": "timetick"}, streaming=False)
    assert parse_read_options({**base, "messageTypes": "Insert"}, streaming=False).message_types == ("insert",)
