"""A channel's range cut into several read tasks (``minPartitions``, ``maxRecordsPerPartition``) gives
the rows and ``_position``s of the unsplit read, on every backend, for 2.5 and 2.6 data, with
transactions straddling the cuts, time-tick violations right after a cut and reads that start AT
a position (Milvus's seek filter). Data: the independent 2.6 test producer (tests/wal26/producer.py).
"""

from __future__ import annotations

import pytest

from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.source.offsets import resolve_end, resolve_start
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.ranges import plan_ranges
from msgstream_spark.spark.partitions import plan_partitions, read_partition
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P

TT = D.TT


def _long_26(env, ch: str) -> None:
    """2.5 inserts and ticks, then 2.6: inserts between ticks, transactions whose bodies span ticks
    (committed, rolled back, one expiring), and a message below the last tick (Milvus drops it)."""
    with env.client() as c, c.create_producer(ch) as prod:
        ids = D.send(prod, [D.old_insert([k], TT - 100 + k) for k in range(1, 4)] + [D.old_tick(TT - 50)])
        lc = D.wal_id(env, ids[0])
        wal = [P.timetick(TT, lc=lc)]
        pk = 10
        for r in range(6):
            t = TT + (r + 1) * (10 << 18)
            txn = 600 + r
            end = [P.commit_txn(t + 9, txn, lc=lc)] if r % 3 == 0 else [P.rollback_txn(t + 9, txn, lc=lc)] \
                if r % 3 == 1 else []  # r % 3 == 2: left open with a 1 ms keepalive, expired by a later tick
            keep = 1 if r % 3 == 2 else 10_000
            wal += [P.insert(t, [pk], lc=lc), P.begin_txn(t + 1, txn, keep, lc=lc),
                    P.in_txn(P.insert(t + 2, [pk + 1], lc=lc), txn, keep), P.timetick(t + 3, lc=lc),
                    P.in_txn(P.delete(t + 4, [pk], lc=lc), txn, keep), P.insert(t + 5, [pk + 2], lc=lc),
                    P.timetick(t + 6, lc=lc), P.insert(t + 5, [pk + 3], lc=lc),  # _tt below the tick: dropped
                    *end, P.timetick(t + 10, lc=lc)]
            pk += 10
        wal.append(P.timetick(TT + (100 << 18), lc=lc))
        P.write(prod, wal)


def _25_only(env, ch: str) -> None:
    with env.client() as c, c.create_producer(ch) as prod:
        D.send(prod, [m for k in range(12) for m in (D.old_insert([k, k + 100], TT + k), D.old_tick(TT + k))])


def _pieces(env, ch: str, **options) -> list:
    opts = parse_read_options({**spark_options(env), "channels": ch, **options}, streaming=False)
    client = opts.client()
    try:
        start = resolve_start(client, [ch], opts.starting, opts.starting_ts, True)
        end = resolve_end(client, [ch], opts.ending, opts.ending_ts)
        return plan_ranges(client, start, end, opts.min_partitions, opts.max_records, dedupe=opts.dedupe)
    finally:
        client.close()


def _sorted(rows: list[dict]) -> list[dict]:
    """Rows in a fixed order: a transaction's rows come from the piece that saw its Begin, so across
    pieces the order is not the unsplit read's (Spark gives no order across partitions either)."""
    return sorted(rows, key=lambda r: sorted((k, repr(v)) for k, v in r.items()))


def _splits(env) -> bool:
    with env.client() as c:
        return c.message_id_from_offset(1) is not None


@pytest.mark.parametrize("data", ["26", "25"])
def test_split_reads_give_the_rows_and_positions_of_the_unsplit_read(backend, data):
    ch = backend.new_channel(f"split{data}")
    (_long_26 if data == "26" else _25_only)(backend, ch)
    whole = D.read_direct(backend, ch)
    if data == "26":
        assert [r["pk"] for r in whole if r["op"] == "insert"] == [1, 2, 3, 10, 12, 11, 20, 22, 30, 32, 40, 42, 41,
                                                                   50, 52, 60, 62]  # commits, rollbacks, expiry
    assert len(whole) > 10 and [r["_position"] for r in whole]  # rows to compare, each with a position
    for opts in ({"maxRecordsPerPartition": "1"}, {"maxRecordsPerPartition": "7"}, {"minPartitions": "3"}):
        pieces = _pieces(backend, ch, **opts)
        got = D.read_direct(backend, ch, **opts)
        assert _sorted(got) == _sorted(whole), opts  # rows, _position, _msg_id: value for value
        if _splits(backend):
            assert len(pieces) > 2, opts
        else:
            assert len(pieces) == 1  # ids that are not offsets (Pulsar): one task per channel
    if data == "26" and _splits(backend):
        # cuts only after a TimeTick for every vchannel (2.6) or after a 2.5 message, never elsewhere
        cut_starts = [s for _ch, s, _e in _pieces(backend, ch, maxRecordsPerPartition="1")[1:]]
        assert any("tick" in s for s in cut_starts) and any("tick" not in s for s in cut_starts)


def test_a_split_read_from_a_position_keeps_the_seek_filter(backend):
    ch = backend.new_channel("splitseek")
    _long_26(backend, ch)
    whole = D.read_direct(backend, ch)
    at = next(r for r in whole if r["pk"] == 20)  # resume AT a row: Milvus's seek on its position
    pos = MsgPosition.from_base64(at["_position"])  # on its vchannel: the same position on the test's channel
    start = {"startingPositions": MsgPosition(ch, pos.msg_id, "", pos.timestamp, pos.wal_name).to_base64()}
    unsplit = D.read_direct(backend, ch, **start)
    assert unsplit and all(r["_ts"] > pos.timestamp for r in unsplit)
    assert _sorted(D.read_direct(backend, ch, maxRecordsPerPartition="2", **start)) == _sorted(unsplit)


def test_dedupe_never_splits_and_options_are_validated(local_env):
    ch = local_env.new_channel("splitopt")
    _25_only(local_env, ch)
    assert len(_pieces(local_env, ch, maxRecordsPerPartition="1", dedupe="true")) == 1
    assert len(_pieces(local_env, ch, maxRecordsPerPartition="1")) == 24  # a 2.5 message ends any piece
    with pytest.raises(Exception, match="maxrecordsperpartition"):
        _pieces(local_env, ch, maxRecordsPerPartition="0")


def test_small_channels_share_read_tasks(backend):
    chans = [backend.new_channel("pack") for _ in range(5)]
    for ch in chans:
        _25_only(backend, ch)
    opts = parse_read_options({**spark_options(backend), "channels": ",".join(chans)}, streaming=False)
    with opts.client() as client:
        start = resolve_start(client, chans, None, None, True)
        end = resolve_end(client, chans, None, None)
        parts = plan_partitions(client, start, end, opts, *D.rows_schema_json())
        four = plan_partitions(client, start, end, parse_read_options(
            {**spark_options(backend), "channels": ",".join(chans), "minPartitions": "4"}, streaming=False),
            *D.rows_schema_json())
    together = [r for p in parts for b in read_partition(p) for r in b.to_pylist()]
    assert _sorted(together) == _sorted([r for ch in chans for r in D.read_direct(backend, ch)])
    if _splits(backend):
        assert len(parts) == 2 and len(four) == 4  # 5 small channels: 2 tasks, or minPartitions
    else:
        assert len(parts) == 5  # sizes unknown without offsets: a task per channel


def test_pack_keeps_large_ranges_alone_and_balances_small_ones():
    from msgstream_spark.source.ranges import PACK_MESSAGES, pack

    assert pack([10, 10, 10, 10]) == [[0, 2], [1, 3]]
    assert pack([PACK_MESSAGES, None, 5, 5, 5]) == [[0], [1], [2, 4], [3]]
    assert pack([5, 5], 2) == [[0], [1]]
    assert len(pack([PACK_MESSAGES - 1] * 6)) == 6  # too large to share: each adds up past a task's share
