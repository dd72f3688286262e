"""``msgstream mirror verify`` against the real Milvus 2.3.5, with a writer running.

A clean mirror passes (keys the writer changed after the table's watermark are "in flux", not errors);
each fault put into the Delta table behind the mirror's back (a row deleted; a row rewritten by delta-rs with
every vector component changed and its ``_seq`` kept, or one beyond the repair's; one vector bit flipped, a
row duplicated, an old version restored, a dropped key's row) is found and named, ``--repair`` fixes them
(one exactly-once commit per repair, in three rounds), a plain verify then passes, and the job streams on
from there to a table equal to ``query``.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.milvus_real import test_mirror
from tests.milvus_real.test_milvus_oracle import await_ticks, pchannels
from tests.milvus_real.test_mirror import Writer, assert_table_equals_query, last_ts, run_job
from tests.milvus_real.workload import Workload, create_all_types, load_for_query

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

# keys the Writer never deletes (it deletes k % 9 in 0..2) nor upserts (it upserts keys >= first_new - 40)
cfg = test_mirror.cfg  # the job's config (the cluster's MQ, milvus.address), a fixture

GONE, FLIPPED, TWICE, OLD, DROPPED, REWRITTEN, AHEAD = 13, 22, 31, 40, 49, 58, 67


def verify(capsys, cfg: str, table, *extra: str) -> tuple[int, list[dict]]:
    from msgstream_spark.cli.main import main

    capsys.readouterr()
    rc = main(["mirror", "verify", "--config", cfg, "--collection", "mir_ver", "--table", str(table),
               "--table-format", "delta", *extra])
    out = capsys.readouterr().out
    return rc, [json.loads(line) for line in out.splitlines() if line.strip()]


def _rows(table, *pks: int) -> pa.Table:
    import pyarrow.compute as pc

    from msgstream_spark.mirror.table import open_existing

    t = open_existing("delta", str(table)).to_arrow()  # delta-rs's own scan (deletion vectors applied)
    return t.filter(pc.is_in(t.column("pk"), pa.array(list(pks), pa.int64())))


def _put(table, rows: pa.Table, delete: int | None = None) -> None:
    """Behind the mirror's back: one commit of another writer (query id ``tamper``) through the table's own
    log primitives, since delta-rs writes no table with deletion vectors: the live row of key ``delete``
    gets deleted (a deletion vector), ``rows`` are added as a new data file (a duplicate if the key lives)."""
    import os
    import uuid

    import pyarrow.parquet as pq

    from msgstream_spark.mirror.formats.base import Plan
    from msgstream_spark.mirror.table import open_existing

    t = open_existing("delta", str(table))
    deletes = {}
    if delete is not None:
        for f in t.live_files():
            keys = pq.read_table(f.path, columns=["pk"]).column("pk").to_numpy()
            pos = np.setdiff1d(np.flatnonzero(keys == delete).astype(np.uint64), f.deleted)
            if len(pos):
                deletes[f.path] = pos
        assert deletes, f"key {delete} is not in the table"
    adds = []
    if rows.num_rows:
        path = os.path.join(str(table), "data", f"tamper-{uuid.uuid4().hex}.parquet")
        pq.write_table(rows.cast(t.schema), path)
        adds.append(path)
    batch = (t.last_batch("tamper") or 0) + 1
    assert t.commit(Plan(adds, deletes, rows.num_rows), query_id="tamper", batch_id=batch)


def _rewrite_with_deltalake(table, pk: int, seq_ahead: bool = False) -> None:
    """Behind the mirror's back with delta-rs's own writers (#38 item 2): the key's row deleted (``DELETE``) and
    appended again (``WRITE``) with every vector component changed, and the same ``_seq`` (``seq_ahead``: one
    beyond any time the log holds, a day ahead of Milvus's clock)."""
    import time

    import deltalake

    from msgstream_spark.mirror.order import snapshot_seq_array
    from msgstream_spark.msg.tso import compose

    row = _rows(table, pk)
    seq = row.column("_seq").to_pylist()
    fv = [[x + 1.0 for x in v] for v in row.column("fv").to_pylist()]
    row = row.set_column(row.schema.get_field_index("fv"), "fv", pa.array(fv, row.schema.field("fv").type))
    if seq_ahead:
        ahead = snapshot_seq_array(compose(int(time.time() * 1000) + 86_400_000), 1)
        row = row.set_column(row.schema.get_field_index("_seq"), "_seq", ahead.cast(row.schema.field("_seq").type))
    deltalake.DeltaTable(str(table)).delete(f"pk = {pk}")
    deltalake.write_deltalake(str(table), row, mode="append")
    got = _rows(table, pk)
    assert got.column("fv").to_pylist() == fv and (seq_ahead or got.column("_seq").to_pylist() == seq)


def _repair_round(capsys, cfg: str, table, found: set, *extra: str, plain_after: bool = False
                  ) -> tuple[list[dict], dict]:
    """verify names exactly ``found`` (exit 3), ``--repair`` leaves no difference, with ``plain_after`` a plain
    verify then exits 0 (the last round; after the others, the next round's first verify naming exactly its own
    faults shows it: a difference a repair left would be named too); the first verify's lines and what the repair
    reports."""
    rc, first = verify(capsys, cfg, table, *extra)
    assert rc == 3 and {(x["kind"], x["pk"]) for x in first if x.get("kind", "in_flux") != "in_flux"} == found, first
    rc, lines = verify(capsys, cfg, table, "--repair")
    after = lines[-1]["summary_after_repair"]
    assert not [x for x in lines if x.get("after_repair", {}).get("kind", "in_flux") != "in_flux"], lines
    assert rc == 0 and after["equal"], lines[-3:]
    if plain_after:
        rc, lines = verify(capsys, cfg, table)  # a plain verify after the repair
        assert rc == 0 and lines[-1]["summary"]["equal"], lines[-3:]
    return first, after["repaired"]


def _flip_bit(rows: pa.Table) -> pa.Table:
    fv = rows.column("fv").to_pylist()
    v = np.asarray(fv[0], np.float32)
    v.view(np.uint32)[1] ^= 1  # the lowest bit of the second float
    fv[0] = v.tolist()
    return rows.set_column(rows.schema.get_field_index("fv"), "fv", pa.array(fv, rows.schema.field("fv").type))


def test_verify_names_each_fault_and_repair_fixes_it(spark, milvus_stack, pymilvus_orm, cfg, tmp_path, capsys):
    w = Workload("mir_ver", create_all_types(pymilvus_orm, "mir_ver"))
    w.insert(range(0, 600))
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_ver"))]
    table = tmp_path / "t"
    run_job(spark, cfg, "mir_ver", table, "delta", *chans)  # snapshot
    old = _rows(table, OLD, DROPPED)  # versions the table held before the changes below
    w.upsert([OLD], gen=2)
    w.delete([DROPPED])
    writer = Writer([w], first_new=600).start()
    try:
        run_job(spark, cfg, "mir_ver", table, "delta", *chans)  # the stream, while the writer writes
        rc, lines = verify(capsys, cfg, table)
        summary = lines[-1]["summary"]
        assert rc == 0 and summary["equal"], lines[-5:]
        assert summary["rows"]["milvus"] > 0 and summary["bytes"]["table"] > 0
        assert all(x.get("kind") == "in_flux" for x in lines[:-1])

        _put(table, pa.table({}), delete=GONE)  # one fault: a deleted row; the repair's first commit is its batch 0
        assert _repair_round(capsys, cfg, table, {("missing", GONE)})[1]["written"] == 1
        writer.stop()  # the later rounds against a log that stops growing: each verify reads its changes again
        # the row: rewritten by delta-rs, same _seq; the repair after a batch 0 (#38 item 2)
        _rewrite_with_deltalake(table, REWRITTEN)
        assert _repair_round(capsys, cfg, table, {("stale", REWRITTEN)})[1]["written"] == 1

        _put(table, _flip_bit(_rows(table, FLIPPED)), delete=FLIPPED)
        _put(table, _rows(table, TWICE))
        _put(table, old.filter(pa.compute.equal(old.column("pk"), OLD)), delete=OLD)
        _put(table, old.filter(pa.compute.equal(old.column("pk"), DROPPED)))
        _rewrite_with_deltalake(table, AHEAD, seq_ahead=True)  # a wrong row with a _seq beyond the repair's
        found = {("stale", FLIPPED), ("duplicated", TWICE), ("stale", OLD), ("extra", DROPPED), ("stale", AHEAD)}
        lines, repaired = _repair_round(capsys, cfg, table, found, "--report-table", str(tmp_path / "report"),
                                        plain_after=True)
        s = lines[-1]["summary"]
        assert (s["missing"], s["extra"], s["stale"], s["duplicated"]) == (0, 1, 3, 1)
        import deltalake

        report = deltalake.DeltaTable(str(tmp_path / "report")).to_pyarrow_table().to_pylist()
        assert {(r["kind"], r["pk"]) for r in report if r["kind"] != "in_flux"} == {(k, str(p)) for k, p in found}
        # one commit: every live row of the five keys deleted (two of TWICE), Milvus's row of four written
        assert (repaired["keys"], repaired["deleted"], repaired["written"]) == (5, 6, 4)
    finally:
        writer.stop()
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_ver"))
    run_job(spark, cfg, "mir_ver", table, "delta", *chans)  # the job goes on over the repaired rows
    load_for_query(w.collection, flushed=False)  # loaded already: the index and load are no-ops
    assert_table_equals_query(table, "delta", w)
    rc, lines = verify(capsys, cfg, table)
    assert rc == 0 and lines[-1]["summary"]["in_flux"] == 0
