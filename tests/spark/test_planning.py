"""The source's driver-side planning without Spark: offsets, ranges, the tick cut, options."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import BackendTimeoutError, OptionError
from msgstream_spark.source.offsets import ChannelOffset, entry, normalize
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.ranges import plan_ranges
from msgstream_spark.source.scan import Scanner
from tests.spark.helpers import Publisher, spark_options


def ids(client, *offsets):
    return [client.message_id_from_offset(o).serialize() for o in offsets]


def test_channel_offset_round_trips_the_json_entry():
    for e in ({"msgID": "", "ts": 0}, entry(b"\x01" * 8, 5, inclusive=True), entry(b"\x02" * 8, 7, exclusive=True),
              entry(b"\x03" * 8, 9, atTick=True)):
        assert ChannelOffset.from_json(e).to_json() == e
    assert ChannelOffset.from_json(entry(b"x", 3, inclusive=True)) == ChannelOffset(b"x", 3, inclusive=True)


def test_ranges_split_only_where_ids_are_offsets(local_env):
    from tests.spark import wal26_data as D

    a, b, c_ = (local_env.new_channel(x) for x in "abc")
    with local_env.client() as c:
        for ch, n in ((a, 100), (b, 10)):  # 2.5 messages: a piece may end with any of them
            with c.create_producer(ch) as prod:
                prod.send_batch([D.old_insert([k], D.TT + k) for k in range(n)])
        start = normalize({ch: entry(b"", 0) for ch in (a, b, c_)})
        end = normalize({a: entry(c.latest_message_id(a).serialize(), 9),
                         b: entry(c.latest_message_id(b).serialize(), 4), c_: entry(b"", 0)})
        whole = plan_ranges(c, start, end, None)
        assert [(ch, s, e) for ch, s, e in whole] == [(a, start[a], end[a]), (b, start[b], end[b])]  # c: nothing
        split = plan_ranges(c, start, end, 11)
        per = {}
        for ch, s, e in split:
            per.setdefault(ch, []).append((s, e))
        assert len(per[a]) == 10 and per[a][0][0] == start[a] and per[a][-1][1] == end[a]
        assert all(x[1]["msgID"] == y[0]["msgID"] for x, y in zip(per[a], per[a][1:]))  # contiguous pieces
        assert per[b] == [(start[b], end[b])]
        assert len(plan_ranges(c, start, end, None, 10)) == 11  # maxRecordsPerPartition: 10 on a, 1 on b
        first = c.first_message_id(a).serialize()
        seek = plan_ranges(c, normalize({a: entry(first, 7, inclusive=True)}), normalize({a: end[a]}), 11)
        assert len(seek) == 11 and seek[0][1]["inclusive"]  # a seek splits too; later pieces keep its filter
        assert all(s.get("seekTs") == 7 and not s.get("inclusive") for _ch, s, _e in seek[1:])


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


def test_a_restarted_scan_stays_aligned_after_a_tick_and_free_after_a_message(local_env):
    """The next batch after an end at a tick waits for the next tick; after an end at a message with a
    time (2.6 messages carry ``_tt``) it does not, or a source whose scans never see ticks (the milvus
    backend) restarts to read nothing, run after run (issue #19)."""
    client = local_env.client()
    ch = local_env.new_channel("restart")
    pub = Publisher(client, [ch])
    pub.rounds(1, rows=3)
    pub.insert(ch, 2)  # after the tick
    pub.close()
    first = Scanner(client, "rows", True)
    try:
        start = normalize({ch: entry(b"", 0)})
        first.refresh(start)
        at_tick, rows = first.plan_end(start, align=None)
        assert rows == 3 and at_tick[ch]["atTick"] is True and at_tick[ch]["ts"] > 0
        data = first.chans[ch].items[-1]  # an end at the last insert, as a channel without ticks has
        at_data = normalize({ch: entry(data.id.serialize(), data.ts)})
    finally:
        first.close()
    pub = Publisher(client, [ch], next_pk=5)
    pub.insert(ch, 2)  # no tick after them yet
    pub.close()
    for start, want in ((at_tick, 0), (at_data, 2)):
        scan = Scanner(client, "rows", True)
        try:
            scan.refresh(start)
            assert scan.plan_end(start, align=None)[1] == want
        finally:
            scan.close()
    client.close()


def test_an_available_now_target_not_yet_delivered_is_waited_for_not_planned_as_nothing(local_env):
    """Spark ends an AvailableNow query at the first plan without new data: a scan that gives up after one
    short poll while the target's messages are still on their way (a loaded proxy, a stream just opened)
    ended the run short (a resumed mirror through the 2.6 proxy streamed 0 rows under load)."""
    import threading

    client = local_env.client()
    ch = local_env.new_channel("late")
    pub = Publisher(client, [ch])
    pub.rounds(1, rows=3)
    pub.close()
    scan = Scanner(client, "rows", True)
    try:
        start = normalize({ch: entry(b"", 0)})
        scan.refresh(start)
        first, rows = scan.plan_end(start, align=None)
        assert rows == 3
        last = client.latest_message_id(ch)
        target = normalize({ch: entry(client.message_id_from_offset(last.offset + 2).serialize(), 0)})
        late = Publisher(client, [ch], ts=pub.ts, next_pk=100)
        writer = threading.Timer(0.5, lambda: (late.rounds(1, rows=4), late.close()))  # insert + tick
        writer.start()
        try:
            scan.refresh(first, until=target, timeout=30)
        finally:
            writer.join()
        end, rows = scan.plan_end(first, align=None, cap=target)
        assert rows == 4 and end[ch]["msgID"] == target[ch]["msgID"]
        beyond = normalize({ch: entry(client.message_id_from_offset(last.offset + 50).serialize(), 0)})
        with pytest.raises(BackendTimeoutError, match=f"channel {ch}: the AvailableNow target .* readTimeout=0.3s"):
            scan.refresh(end, until=beyond, timeout=0.3)
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
