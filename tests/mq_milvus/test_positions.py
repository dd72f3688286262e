"""Resuming from a pack end, and reading the range between two positions, through the suite's proxy and on
its embedded log directly (the same WAL: the proxy's legacy position bytes are the log's ids).

The scenario is the 2.6 stream tests' (an upgraded pchannel: a 2.5 entry, then 2.6 messages with committed,
rolled-back and interleaved transactions) with three more pre-upgrade entries, so that version-0 entries
share a ``_tt`` as real ones do (one 2.5 insert per partition, an upsert's delete and insert): I7 shares I1's
(TT - 30), I8 and I9 share TT - 25.

* Version 0: a burst of the proxy can end between two entries of one ``_tt``. A pack end there must not
  claim that ``_tt`` (a resume from it, Milvus's "skip what is at or below the time", would drop the rest of
  them): the pack ends just below it. Each case forces the burst boundary with the proxy's ``pause_after``.
* End positions: a read that ends at a position holds what a resume from that position would not read
  (``_tt`` at or below its time, up to the first TimeTick at or after it), not "everything before its
  ``msgID``": a pack end's ``msgID`` is an ``_lc``, often before messages that belong to the pack.
"""

from __future__ import annotations

import time

import pytest

from msgstream_spark.config import Config
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg.pb import msg_pb2
from msgstream_spark.source import read_table
from msgstream_spark.stream import TtMsgStream
from tests.fixtures.milvus_env import StoreWriter, milvus_config
from tests.fixtures.waits import wait_until
from tests.wal26 import producer as P
from tests.wal26.test_stream26 import ALL, END, TT, _drain, _rows, scenario, write_wal

EXTRA = [([7], TT - 30), ([8], TT - 25), ([9], TT - 25)]  # more pre-upgrade inserts (version 0 through the proxy)
ALL_V0 = ALL[:1] + [("I", pks, ts) for pks, ts in EXTRA] + ALL[1:]
LAST = ALL[-1][2]  # the last message's _tt: where the last pack through the proxy ends
# What the proxy sends, in order: (_tt, a version-0 entry). A transaction comes whole at its Commit's _tt.
SENT = [(TT - 30, True), (TT - 30, True), (TT - 25, True), (TT - 25, True), (TT + 1, False),
        *[(TT + 5, False)] * 4, *[(TT + 23, False)] * 4, (TT + 24, False)]
SCHEMA = "pk bigint, vec array<float>"  # the read core's schema option: no inference scan per read


def _insert25(vc: str, pks: list[int], ts: int, msg_id: int) -> tuple:
    """A 2.5 insert as the 2.5 proxy wrote it (its own MsgBase msgID: TtMsgStream drops repeated 2.5 ids)."""
    req = msg_pb2.InsertRequest.FromString(P.insert_body(pks, ts, shard=vc, segment=9))
    req.base.msgID = msg_id
    return req.SerializeToString(), {"msg_type": "Insert"}, ts


def _fill(proxy) -> str:
    ch = f"{P.PCHANNEL}-shared"
    vc = f"{ch}_{P.COLLECTION}v0"
    items = scenario(vc)
    extra = [_insert25(vc, pks, ts, 70 + i) for i, (pks, ts) in enumerate(EXTRA)]
    w = StoreWriter(proxy.store_path)
    try:
        write_wal(w.client, ch, items[:1] + extra + items[1:])
    finally:
        w.close()
    return ch


def _end_after(sent: int) -> int:
    """Where the pack after a burst of the first ``sent`` messages ends: the last one's _tt, or just below it
    for a version-0 entry (more entries of that _tt may follow)."""
    tt, v0 = SENT[sent - 1]
    return tt - 1 if v0 else tt


def _open_paused(s, proxy, ch: str, pauses: tuple[int, ...]):
    """Open the stream's DumpMessages call paused before its first message (then after each of ``pauses``);
    the stream's queue of received entries (white box), to wait until a burst has fully arrived."""
    proxy.state.pause_after = (0, *pauses)
    assert s.consume(0.2) is None  # opens the call; nothing sent yet
    return s._consumers[ch]._stream


def _burst(proxy, queue, count: int) -> None:
    """Let the proxy send its next burst and wait until all ``count`` entries of it were received."""
    proxy.state.release()
    wait_until(lambda: queue._q.qsize() >= count, 60, f"a burst of {count} entries", poll=0.02,
               seen=lambda: queue._q.qsize())


def _packs_to(stream, proxy, end_tt: int, bound: float = 60.0) -> list:
    """Packs until one ends at or above ``end_tt`` (the proxy paused after a burst, so it must come); bounded."""
    packs: list = []
    deadline = time.monotonic() + bound
    while not packs or packs[-1].end_ts < end_tt:
        assert time.monotonic() < deadline, (
            f"no pack ended at TT{end_tt - TT:+d} or later within {bound:.0f} s; pack ends so far "
            f"{[p.end_ts - TT for p in packs]}, the proxy sent {proxy.state.sent} messages")
        pack = stream.consume(1.0)
        if pack is not None:
            packs.append(pack)
    return packs


def _served(cfg, ch: str, pos) -> int:
    """How many entries the proxy sends from a position to the last one (a reader's count: no ticks)."""
    client = build_client("milvus", cfg)
    try:
        last = client.latest_message_id(ch)
        reader = client.reader(ch)
        reader.seek(client.bytes_to_message_id(pos.msg_id), inclusive=True)
        n = 0
        for _ in range(100):  # bounded
            batch = reader.receive_batch(100, 5.0)
            n += len(batch)
            if batch and batch[-1].id == last:
                return n
        raise AssertionError(f"the reader never reached the last entry {last}")
    finally:
        client.close()


def _local(proxy) -> Config:
    return Config.from_dict({"mq": {"type": "local"}, "local": {"path": proxy.store_path}})


def _read(cfg, ch: str, start=None, end=None, **split) -> list:
    opts = {"schema": SCHEMA, **split}
    if start is not None:
        opts["startingPositions"] = start.to_base64()
    if end is not None:
        opts["endingPositions"] = end.to_base64()
    return sorted((r["op"], r["pk"], r["_ts"]) for r in read_table(cfg, ch, **opts).to_pylist())


def _want(lo: int | None, hi: int | None) -> list:
    return sorted(({"I": "insert", "D": "delete"}[op], pks[0], ts) for op, pks, ts in ALL_V0
                  if (lo is None or ts > lo) and (hi is None or ts <= hi))


@pytest.mark.parametrize("sent", [1, 2, 3, 4, 5],
                         ids=["after-I1", "after-I7-same-tt", "after-I8", "after-I9-same-tt", "after-I2-wal"])
def test_a_pack_end_among_version_0_entries_resumes_exactly_once(milvus_proxy, tmp_path, sent):
    """The pack after a burst that ends among version-0 entries: resuming from its end positions (a seeked
    TtMsgStream whose first burst holds everything, the read core's ``startingPositions`` on both backends,
    a named subscription closed there) gives every later row once. Before, the pack ended at their ``_tt``
    and a resume from it dropped the entries of that ``_tt`` still to come (I7 after I1, I9 after I8)."""
    ch = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path)
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "v0-a", "earliest")
        _burst(milvus_proxy, _open_paused(s, milvus_proxy, ch, (sent,)), sent)
        first = _packs_to(s, milvus_proxy, _end_after(sent))
        saved = first[-1].end_positions
    rest_count = _served(cfg, ch, saved[0])
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "v0-b", "unknown")
        s.seek(saved)
        _burst(milvus_proxy, _open_paused(s, milvus_proxy, ch, ()), rest_count)
        rest = _drain(s, LAST)
    assert _rows(first) + _rows(rest) == ALL_V0
    after = _want(first[-1].end_ts, None)
    assert _read(cfg, ch, start=saved[0]) == after, "the read core through the proxy"
    assert _read(_local(milvus_proxy), ch, start=saved[0]) == after, "the read core on the log"
    assert first[-1].end_ts == _end_after(sent)  # below a version-0 entry's _tt: others may share it
    with TtMsgStream(build_client("milvus", cfg)) as s:  # a named subscription's cursor, closed at the pack end
        s.as_consumer([ch], "v0-sub", "earliest")
        _burst(milvus_proxy, _open_paused(s, milvus_proxy, ch, (sent,)), sent)
        first = _packs_to(s, milvus_proxy, _end_after(sent))
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "v0-sub", "earliest")
        rest = _drain(s, LAST)
        assert s.consume(0.3) is None
    assert _rows(first) + _rows(rest) == ALL_V0


def _proxy_pack_ends(proxy, cfg, ch: str) -> list:
    """(end tick, end position) of the packs a TtMsgStream cuts through the proxy, bursts ending after the
    first entry of each _tt (version 0 among them), after each transaction and at the last entry."""
    pauses = (1, 3, 5, 9, 13, 14)
    ends = []
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "ends", "earliest")
        queue = _open_paused(s, proxy, ch, pauses)
        before = 0
        for sent in pauses:
            _burst(proxy, queue, sent - before)
            pack = _packs_to(s, proxy, _end_after(sent))[-1]
            ends.append((pack.end_ts, pack.end_positions[0]))
            before = sent
    return ends


def _log_pack_ends(proxy, ch: str) -> list:
    """The same from the embedded log directly: packs cut at the WAL's own TimeTicks."""
    with TtMsgStream(build_client("local", _local(proxy))) as s:
        s.as_consumer([ch], "ends", "earliest")
        packs = _drain(s, END)
    assert [p.end_ts for p in packs] == [TT - 20, TT, TT + 15, TT + 22, TT + 30]
    return [(p.end_ts, p.end_positions[0]) for p in packs]


@pytest.mark.parametrize("ends_from", ["proxy", "log"])
@pytest.mark.parametrize("read", ["milvus", "local"])
def test_ranges_between_pack_ends_hold_exactly_their_rows(milvus_proxy, tmp_path, ends_from, read):
    """From each pack end (and the start) to each later pack end (and the latest), the read core's rows are
    exactly the rows of the packs between: ``_tt`` above the start's tick, at or below the end's. Before, a
    range stopped before its end position's ``msgID`` (an ``_lc``) and lost rows there: the transaction
    committed at TT + 23 behind the insert at TT + 24, the rows right after the opening tick, ..."""
    ch = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path)
    ends = _proxy_pack_ends(milvus_proxy, cfg, ch) if ends_from == "proxy" else _log_pack_ends(milvus_proxy, ch)
    reader = cfg if read == "milvus" else _local(milvus_proxy)
    points = [(None, None), *ends, (None, None)]  # the start of the channel, the pack ends, the latest
    for i in range(len(points) - 1):
        lo, start = points[i]
        for j in range(i + 1, len(points)):
            hi, end = points[j]
            where = (f"from {'the start' if lo is None else f'TT{lo - TT:+d}'} to "
                     f"{'the latest' if hi is None else f'TT{hi - TT:+d}'}")
            assert _read(reader, ch, start, end) == _want(lo, hi), where
            # cut into pieces (after TimeTicks): a piece ending inside a transaction reads on to its Commit,
            # which may lie past the end position's msgID
            assert _read(reader, ch, start, end, maxRecordsPerPartition="3") == _want(lo, hi), f"{where}, cut"
    consecutive = [row for i in range(len(points) - 1) for row in _read(reader, ch, points[i][1], points[i + 1][1])]
    assert sorted(consecutive) == _want(None, None)  # every row once


@pytest.mark.parametrize("read", ["milvus", "local"])
def test_ending_timestamp_holds_every_row_at_or_below_it(milvus_proxy, tmp_path, read):
    """``endingTimestamp`` is a position too (the first message after it, and its time): the transaction
    committed at TT + 23 lies behind the insert at TT + 24 in the log, and belongs to a read ending there."""
    ch = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path) if read == "milvus" else _local(milvus_proxy)
    for tt in sorted({ts for _, _, ts in ALL_V0} | {TT + 15, TT + 22}):
        got = sorted((r["op"], r["pk"], r["_ts"]) for r in read_table(cfg, ch, schema=SCHEMA,
                                                                      endingTimestamp=tt).to_pylist())
        assert got == _want(None, tt), f"endingTimestamp TT{tt - TT:+d}"
