"""A database job's writing task splits its packed rows by collection column-wise (``source.pieces``):
each collection's rows are what ``source.multi.unpack`` makes of its pieces (the reference: a piece at a time,
its bytes copied into Python), for inserts, deletes (``$key``), pieces of several shapes, a batch column that is
a slice of a larger one, and a snapshot time; no Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.source.arrow import read_table
from msgstream_spark.source.multi import unpack
from msgstream_spark.source.pieces import pieces, split_fn, unpack_fn
from msgstream_spark.source.rows import rows_arrow_schema
from tests.mirror_job.many_log import ManyLog, schema


def _sorted(t: pa.Table) -> list[dict]:
    return sorted(t.to_pylist(), key=lambda r: (r["_seq"], r["op"]))


def test_the_split_makes_each_collections_rows_as_unpack_does(local_env):
    chans = [local_env.new_channel("split") for _ in range(2)]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 21)
        log.create("db1", "b", 22)
        log.insert(21, range(30))
        log.insert(22, range(5))
        log.tick()
        log.delete(21, [3, 7])
        log.upsert(22, [1], gen=1)
        log.insert(21, range(100, 104))
        log.tick()
        log.close()
    t = read_table(local_env.config.to_dict(), chans, output="collections")
    rows = t.filter(pc.equal(t.column("kind"), "rows")).select(["_collection", "payload"])
    assert rows.num_rows >= 6  # pieces of inserts and deletes of both, on both channels
    schemas = {cid: rows_arrow_schema(collection_arrow_schema(schema(n))) for cid, n in ((21, "a"), (22, "b"))}
    ts = sorted(t.filter(pc.equal(t.column("kind"), "rows")).column("_ts").drop_null().to_pylist() or [0])
    for min_ts in (None, ts[len(ts) // 2]):
        want = {cid: unpack(rows.filter(pc.equal(rows.column("_collection"), cid)).column("payload").to_pylist(),
                            schemas[cid], "pk", min_ts) for cid in schemas}
        batch = pa.concat_tables([rows.slice(0, 1), rows]).combine_chunks().to_batches()[0].slice(1)  # an offset
        got = dict(split_fn({cid: (s, "pk", min_ts) for cid, s in schemas.items()})(batch))
        assert set(got) == {cid for cid, w in want.items() if w.num_rows}
        for cid, g in got.items():
            assert g.schema == schemas[cid]
            assert _sorted(g) == _sorted(want[cid]), cid
        only_b = dict(split_fn({22: (schemas[22], "pk", min_ts)})(batch))  # a collection not asked for: left out
        assert list(only_b) == [22] and _sorted(only_b[22]) == _sorted(want[22])
        a_pieces = rows.filter(pc.equal(rows.column("_collection"), 21)).select(["payload"])
        one = pa.Table.from_batches(list(unpack_fn(schemas[21], "pk", min_ts)(a_pieces.to_batches(max_chunksize=2))),
                                    schemas[21])
        assert _sorted(one) == _sorted(want[21])
    assert len(pieces(rows.column("payload"))) == rows.num_rows
    assert pieces(pa.array([None], pa.binary())) == []
    of_a = rows.filter(pc.equal(rows.column("_collection"), 21)).column("payload")
    first, second = (of_a[i].as_py() for i in (0, 1))  # chosen rows, a null among them
    mixed = pa.array([first, None, second], pa.binary())
    got = pieces(mixed, np.array([2, 1, 0]))
    assert [g.to_pylist() for g in got] == [pa.ipc.open_stream(p).read_all().to_pylist() for p in (second, first)]
    ids = pa.array([None, 21, 99], pa.int64())  # a row without a collection id, one not asked for: left out
    odd = pa.RecordBatch.from_arrays([ids, pa.array([second, first, second], pa.binary())], ["_collection", "payload"])
    got = dict(split_fn({21: (schemas[21], "pk", None)})(odd))
    assert list(got) == [21] and _sorted(got[21]) == _sorted(unpack([first], schemas[21], "pk"))
