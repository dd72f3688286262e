"""Milvus's seek semantics, one table, every entry point, every backend.

Resuming from a position starts AT its msgID and drops messages with BeginTs <= its timestamp
until the first time tick >= it (that tick too). The library's TtMsgStream, a Spark batch read
and a Spark stream with ``startingPositions``, and ``msgstream tail --from`` must keep exactly the
same data messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import TimeTickMsg
from msgstream_spark.stream import TtMsgStream
from msgstream_spark.stream.seek import BEFORE, DONE, EndFilter, SeekFilter
from tests.sink.helpers import config_file
from tests.spark.helpers import MS, TS0, Publisher, spark_options

# (name, messages as "I<ts>" insert / "T<ts>" tick, index the position points at, its timestamp, kept indices)
CASES = [
    ("tick_ends_the_seek", "I10 I20 T20 I15 I30 T40", 0, 20, [3, 4, 5]),
    ("late_message_before_the_tick", "I10 I30 I15 T40 I50 T60", 0, 20, [1, 4, 5]),
    ("an_early_tick_does_not_end_it", "T10 I25 T30 I35 T40", 0, 20, [1, 3, 4]),
    ("position_in_the_middle", "I10 T20 I30 I40 T50 I45 T60", 2, 20, [2, 3, 5, 6]),
    ("position_on_a_tick", "I10 T20 I30 T40", 1, 20, [2, 3]),
]


@pytest.mark.parametrize("name,spec,at,ts,kept", CASES, ids=[c[0] for c in CASES])
def test_seek_filter_table(name, spec, at, ts, kept):
    f = SeekFilter(ts)
    items = spec.split()[at:]
    got = [at + i for i, it in enumerate(items) if f.keep(it[0] == "T", int(it[1:]))]
    assert got == kept


@pytest.mark.parametrize("name,spec,at,ts,kept", CASES, ids=[c[0] for c in CASES])
def test_end_filter_holds_what_the_seek_drops(name, spec, at, ts, kept):
    """A read ending at the position keeps exactly the data messages a resume from it drops, and stops at the
    tick that ends the seek (before it, from the position's msgID on, a later message can still be older)."""
    f = EndFilter(ts)
    items = spec.split()
    held, stop = list(range(at)), None
    for i, it in enumerate(items[at:], at):
        side = f.side(it[0] == "T", int(it[1:]))
        if side == DONE:
            stop = i
            break
        if side == BEFORE:
            held.append(i)
    data = [i for i, it in enumerate(items) if it[0] == "I"]
    assert [i for i in held if i in data] == [i for i in data if i not in kept]
    assert stop is not None and items[stop][0] == "T" and int(items[stop][1:]) >= ts
    ordered = EndFilter(ts, ordered=True)  # sorted by time, no ticks: the first message after ts ends it
    assert [ordered.side(False, t) for t in (ts - 1, ts, ts + 1)] == [BEFORE, BEFORE, DONE]


@dataclass
class Seeded:
    """One channel per case, its position and the pks of the inserts the seek must keep."""

    channels: list[str]
    positions: dict[str, MsgPosition]
    expected: set[int]
    publisher: Publisher
    final_tick: int  # every channel ends with this tick, so one stream over all of them drains each


FINAL_TICK = TS0 + 100 * MS


@pytest.fixture
def seeded(backend):
    client = backend.client()
    chans = [backend.new_channel("seek") for _ in CASES]
    pub = Publisher(client, chans)
    positions, expected = {}, set()
    for ch, (_, spec, at, ts, kept) in zip(chans, CASES):
        for i, item in enumerate(spec.split()):
            t = TS0 + int(item[1:]) * MS
            if item[0] == "T":
                mid = pub._p(ch).send(_tick(t))
            else:
                pub.ts = t - MS  # Publisher.insert steps the clock by one ms first
                pub.insert(ch, 1)
                mid = _last_id(pub, ch)
                if i in kept:
                    expected.add(pub.next_pk - 1)
            if i == at:
                positions[ch] = MsgPosition(ch, mid.serialize(), "", TS0 + ts * MS)
        pub._p(ch).send(_tick(FINAL_TICK))
    pub.close()
    yield Seeded(chans, positions, expected, pub, FINAL_TICK)
    client.close()


def _tick(ts: int):
    from msgstream_spark.mq.base import ProducerMessage
    from msgstream_spark.msg import codec

    payload, props = codec.marshal(TimeTickMsg.build(ts))
    return ProducerMessage(payload, props, timestamp=ts)


def _last_id(pub: Publisher, ch: str):
    mid = pub.client.latest_message_id(ch)
    assert mid is not None
    return mid


def _positions_json(seeded: Seeded) -> str:
    return json.dumps({ch: p.to_json_dict() for ch, p in seeded.positions.items()})


def test_library_tt_msgstream(backend, seeded):
    got = set()
    with TtMsgStream(backend.client()) as s:
        s.as_consumer(seeded.channels, "seek-semantics", "unknown")
        s.seek(list(seeded.positions.values()))
        while s.last_end_ts < seeded.final_tick:  # until every channel's final tick is cut
            pack = s.consume(timeout=30.0)
            assert pack is not None, "no time-tick pack within 30 s"
            got |= {int(pk) for m in pack.msgs for pk in m.to_arrow().column("pk").to_pylist()}
    assert got == seeded.expected


@pytest.mark.slow
def test_spark_batch(spark, backend, seeded):
    df = (spark.read.format("msgstream").options(**spark_options(backend))
          .option("channels", ",".join(seeded.channels)).option("startingPositions", _positions_json(seeded))
          .load())
    assert {r.pk for r in df.select("pk").collect()} == seeded.expected


@pytest.mark.slow
def test_spark_stream(spark, backend, seeded, tmp_path):
    df = (spark.readStream.format("msgstream").options(**spark_options(backend))
          .option("channels", ",".join(seeded.channels)).option("subscription", "seek-semantics")
          .option("startingPositions", _positions_json(seeded)).load())
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert q.awaitTermination(120) is not False
    assert {r.pk for r in spark.read.parquet(str(tmp_path / "out")).select("pk").collect()} == seeded.expected


def test_cli_tail_from(backend, seeded, tmp_path, capsys):
    from msgstream_spark.cli.main import main

    cfg = config_file(backend, tmp_path)
    positions = json.dumps([p.to_json_dict() for p in seeded.positions.values()])
    assert main(["tail", "--config", cfg, "-c", ",".join(seeded.channels), "--from", positions,
                 "--timeout", "1", "--rows"]) == 0
    got = set()
    for line in capsys.readouterr().out.splitlines():
        msg = json.loads(line)
        if msg["msg_type"] == "Insert":
            got |= {int(r["pk"]) for r in msg["rows"]}
    assert got == seeded.expected
