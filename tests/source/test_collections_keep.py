"""``output=collections`` read with ``keep`` (``source.read.read_range``): the database job's own read tasks
(``spark.mirror_many_direct``) decode only their collections' rows and count the others'; what they get must be
what the stream's read of the same ranges gives."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.source.arrow import plan_read, read_options
from msgstream_spark.source.multi import KIND_ROWS, collections_arrow_schema
from msgstream_spark.source.read import read_range
from tests.mirror_job.many_log import two_collections


def _log(local_env) -> list[str]:
    return two_collections(local_env, "keep")[0]


def _read(local_env, chans, keep):
    opts = read_options(local_env.config.to_dict(), chans, output="collections")
    _, ranges = plan_read(opts)
    return pa.Table.from_batches([b for r in ranges for b in read_range(r, collections_arrow_schema(), keep=keep)],
                                 schema=collections_arrow_schema())


def _rows_of(t: pa.Table, cid: int) -> pa.Table:
    return t.filter(pc.and_(pc.equal(t.column("kind"), KIND_ROWS), pc.equal(t.column("_collection"), cid)))


def test_a_kept_collection_reads_as_the_full_read_and_the_others_are_counted(local_env):
    chans = _log(local_env)
    full = _read(local_env, chans, None)
    kept = _read(local_env, chans, frozenset({11}))
    # collection 11's pieces: the same bytes as the full read's
    assert _rows_of(kept, 11).column("payload").to_pylist() == _rows_of(full, 11).column("payload").to_pylist()
    # collection 12 is counted: no payload, its rows (3 inserts, the upsert's insert and delete), name, database
    b = _rows_of(kept, 12)
    assert b.column("payload").null_count == b.num_rows > 0
    assert sum(b.column("rows").to_pylist()) == sum(_rows_of(full, 12).column("rows").to_pylist()) == 5
    assert set(b.column("db").to_pylist()) == {"db2"}
    # the DDL rows whole and in the same order, with their schemas
    ddl = [r for r in full.to_pylist() if r["kind"] != KIND_ROWS]
    assert [r for r in kept.to_pylist() if r["kind"] != KIND_ROWS] == ddl
    assert {r["kind"] for r in ddl} == {"create", "drop"} and all(r["payload"] for r in ddl if r["kind"] == "create")


def test_nothing_kept_counts_every_collection_and_decodes_no_row(local_env):
    chans = _log(local_env)
    full = _read(local_env, chans, None)
    none = _read(local_env, chans, frozenset())
    rows = none.filter(pc.equal(none.column("kind"), KIND_ROWS))
    assert rows.column("payload").null_count == rows.num_rows
    for cid in (11, 12):
        counted, decoded = _rows_of(none, cid), _rows_of(full, cid)
        assert sum(counted.column("rows").to_pylist()) == sum(decoded.column("rows").to_pylist()) > 0
    assert none.nbytes < full.nbytes / 4
