"""The merge-on-read tables read by plain readers, without this project's code: delta-rs's DataFusion scan
(QueryBuilder) and Polars for Delta with deletion vectors; pyiceberg and Polars for Iceberg with position
deletes. Each must see exactly the model of Milvus's query after inserts, upserts and deletes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.mirror import apply_batch, open_table
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert


def _batches() -> list[list]:
    return [
        [insert(10, *[(p, f"a{p}") for p in range(50)])],
        [*upsert(20, *[(p, f"b{p}") for p in range(0, 50, 3)]), delete(21, *range(1, 50, 7))],
        [*upsert(30, *[(p, f"c{p}") for p in range(0, 50, 5)]), insert(31, (60, "x"), (61, "y")), delete(32, 60)],
    ]


def _fill(fmt: str, loc: str) -> dict:
    t = open_table(fmt, loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    seen: list = []
    for i, b in enumerate(_batches()):
        assert apply_batch(t, to_arrow(b), "pk", "q", i)
        seen += b
    return model(seen)


def test_delta_readers_see_the_collection(tmp_path):
    import deltalake
    import polars as pl

    loc = str(tmp_path / "t")
    want = _fill("delta", loc)
    dt = deltalake.DeltaTable(loc)
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    assert table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                           for f in got.schema]))) == want
    assert table_state(pl.read_delta(loc).to_arrow()) == want
    with pytest.raises(Exception, match="deletionVectors"):
        dt.to_pyarrow_table()  # delta-rs's pyarrow path refuses deletion vectors (documented)


def test_iceberg_readers_see_the_collection(tmp_path):
    import polars as pl
    from pyiceberg.catalog.sql import SqlCatalog

    loc = str(tmp_path / "t")
    want = _fill("iceberg", loc)
    cat = SqlCatalog("msgstream", uri=f"sqlite:///{loc}_catalog.sqlite", warehouse=f"file://{loc}")
    tbl = cat.load_table(("msgstream", "coll"))
    assert any(t.delete_files for t in tbl.scan().plan_files())  # the layout really has position deletes
    assert table_state(tbl.scan().to_arrow()) == want
    assert table_state(pl.scan_iceberg(tbl).collect().to_arrow()) == want


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_second_writer_is_refused_with_the_holder_named(fmt, tmp_path):
    """Another process holds the table's writer lock (a compaction): the batch fails naming it, nothing written."""
    import subprocess
    import sys

    from msgstream_spark.errors import MirrorError

    loc = str(tmp_path / "t")
    t = open_table(fmt, loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from msgstream_spark.mirror.store.writer import writer_lock\n"
                               "from msgstream_spark.mirror.store import open_store\n"
                               "with writer_lock(open_store(sys.argv[1]), sys.argv[1], 'test'):\n"
                               "    print('held', flush=True)\n"
                               "    sys.stdin.read()", loc], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(MirrorError, match=r"another writer \(pid \d+"):
            apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
        assert t.last_batch("q") is None
    finally:
        holder.communicate("", timeout=30)
    assert apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)  # released when its holder ended
    assert table_state(t.to_arrow()) == {1: ("a", 10)}
