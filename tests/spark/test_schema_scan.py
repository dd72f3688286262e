"""Schema inference's scan (no Spark session): where it stops, what it leaves undecoded, and
the pieces RowsBuilder hands to Spark. Data: the independent test producer on the embedded log."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import msg_pb2
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.rows import PASS_THROUGH_BYTES, RowsBuilder
from msgstream_spark.source.schema import _insert_collection, _scan_channel
from msgstream_spark.spark.structs import infer
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P

OTHER = P.COLLECTION + 10


def _other_insert(pks, ts) -> ProducerMessage:
    req = msg_pb2.InsertRequest()
    req.ParseFromString(P.insert_body(pks, ts, collection=OTHER, shard=D.VC, segment=P.SEGMENT))
    req.collection_name = "other"
    return ProducerMessage(req.SerializeToString(), {"msg_type": "Insert"}, ts)


def _opts(env, ch, **extra):
    return parse_read_options({**spark_options(env), "channels": ch, **extra}, streaming=False)


def test_the_header_read_names_the_insert_collection():
    body = P.insert_body(list(range(50)), D.TT, collection=-7)
    assert _insert_collection(body) == (-7, "c26")
    assert _insert_collection(b"\x0a\xff") is None  # does not read: the full decode decides


def test_a_second_collection_after_many_inserts_is_still_found(local_env):
    ch = local_env.new_channel("scan")
    with local_env.client() as c, c.create_producer(ch) as prod:
        D.send(prod, [D.old_insert([i], D.TT + i) for i in range(30)] + [_other_insert([99], D.TT + 40)])
    with pytest.raises(SchemaError, match=f"several collections \\(ids {P.COLLECTION}, {OTHER}\\)"):
        infer(_opts(local_env, ch), [ch])
    assert infer(_opts(local_env, ch, collection="other"), [ch])[2] == OTHER
    assert infer(_opts(local_env, ch, collection=str(P.COLLECTION)), [ch])[2] == P.COLLECTION


def test_the_scan_stops_at_the_given_last_id(local_env):
    """Messages after the channel's latest id as of the scan's start are not read."""
    ch = local_env.new_channel("scan")
    with local_env.client() as c, c.create_producer(ch) as prod:
        ids = D.send(prod, [D.old_insert([1], D.TT), D.old_insert([2], D.TT + 1), _other_insert([3], D.TT + 2)])
    found: dict = {}
    with local_env.client() as c:
        cons = c.reader(ch)
        try:
            cons.seek(c.earliest_message_id(), inclusive=True)
            _scan_channel(_opts(local_env, ch), ch, cons, ids[1], float("inf"), (found, {}, set()))
        finally:
            cons.unsubscribe()
    assert list(found) == [P.COLLECTION]


def test_an_empty_channel_is_skipped(local_env):
    empty, full = local_env.new_channel("empty"), local_env.new_channel("scan")
    with local_env.client() as c, c.create_producer(full) as prod:
        D.send(prod, [D.old_insert([1], D.TT)])
    assert infer(_opts(local_env, f"{empty},{full}"), [empty, full])[2] == P.COLLECTION


def test_flush_passes_large_pieces_through_and_joins_small_ones():
    schema = pa.schema([("x", pa.int64())])
    big = PASS_THROUGH_BYTES // 8  # rows of 8 bytes
    sizes = [3, big, 2, 4, big + 1, 1]
    b = RowsBuilder(schema)
    start = 0
    for n in sizes:
        b.pieces.append(pa.record_batch([pa.array(range(start, start + n), pa.int64())], schema=schema))
        start += n
    pieces = list(b.pieces)
    out = b.flush()
    assert [o.num_rows for o in out] == [3, big, 6, big + 1, 1]
    assert out[1] is pieces[1] and out[3] is pieces[4]  # not copied
    assert pa.Table.from_batches(out).column("x").to_pylist() == list(range(start))
    assert b.pieces == [] and b.rows == 0


def test_flush_joins_half_mebibyte_pieces_into_batches_of_about_a_mebibyte():
    """A 1000-row insert of 128-d vectors is a ~0.5 MiB piece: Spark gets them joined into ~1 MiB batches (its JVM
    pays per batch), not one batch each; the rows keep their order."""
    schema = pa.schema([("x", pa.int64())])
    n = (PASS_THROUGH_BYTES * 2 // 5) // 8  # 0.4 MiB pieces
    b = RowsBuilder(schema)
    for i in range(7):
        b.pieces.append(pa.record_batch([pa.array(range(i * n, (i + 1) * n), pa.int64())], schema=schema))
    out = b.flush()
    assert [o.num_rows for o in out] == [3 * n, 3 * n, n]  # joined until a run reaches PASS_THROUGH_BYTES
    assert PASS_THROUGH_BYTES == 1024 * 1024
    assert pa.Table.from_batches(out).column("x").to_pylist() == list(range(7 * n))


def test_event_time_is_the_hybrid_timestamps_physical_part():
    """``_event_time`` wraps the computed microseconds as Arrow's buffer (no conversion pass): same values and type."""
    import numpy as np

    from msgstream_spark.source.rows import _event_time

    ms = np.array([1_795_000_000_000, 1_795_000_000_007, 0], dtype=np.uint64)
    got = _event_time((ms << np.uint64(18)) | np.uint64(3))
    assert got.type == pa.timestamp("us", tz="UTC")
    assert got == pa.array([int(x) * 1000 for x in ms], pa.timestamp("us", tz="UTC"))
