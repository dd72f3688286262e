"""A batch's data files (``TaskWriter``) dictionary-encode every column but float vectors: a vector's floats only
paid for a dictionary that never fills (a database job's 20 small shares per batch: each a small file whose
vectors went through a dictionary, 10x the CPU of writing them plain). The rows read back are the rows
written."""

from __future__ import annotations

import pyarrow.parquet as pq

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.write.layout import TaskWriter
from tests.mirror.changes import FIELDS, insert, to_arrow


def test_a_data_file_writes_float_vectors_without_a_dictionary(tmp_path):
    t = open_table("delta", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    w = TaskWriter(t.write_spec())
    w.add(to_arrow([insert(10, *[(p, f"v{p % 3}") for p in range(50)])]))
    (written,) = w.close()
    meta = pq.ParquetFile(written.path).metadata
    cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    vector = [c for name, c in cols.items() if name.startswith("fv.")]
    assert vector and all(not c.has_dictionary_page for c in vector), [c.encodings for c in vector]
    assert cols["v"].has_dictionary_page and cols["pk"].has_dictionary_page  # the other columns keep theirs
    got = pq.read_table(written.path).select(["pk", "v", "fv"]).sort_by("pk").to_pylist()
    assert [(r["pk"], r["v"]) for r in got] == [(p, f"v{p % 3}") for p in range(50)]
    assert all(len(r["fv"]) == 2 for r in got)


def test_a_changes_file_keeps_a_dictionary_for_its_repeated_columns_only(tmp_path):
    """A changes file (read whole by the planning tasks): op, the data file and the collection id dictionary-encoded,
    the key and ``_seq`` (unique) plain, no statistics; the narrow rows read back are the rows written."""
    from msgstream_spark.mirror.store.parquet import read_parquet
    from msgstream_spark.mirror.write.taskplan import ChangesFile, changes_dir, changes_files

    t = open_table("delta", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    spec = t.write_spec()
    w = TaskWriter(spec)
    ch = ChangesFile(spec.store(), changes_dir(spec.data_dir, "q", 0), spec.key_type)
    narrow = w.add(to_arrow([insert(10, *[(p, f"v{p}") for p in range(50)])]))
    ch.add(narrow)
    (path,) = changes_files(ch.close(w.close()))
    meta = pq.ParquetFile(path).metadata
    cols = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert {n for n, c in cols.items() if c.has_dictionary_page} == {"op", "_file", "_collection"}
    assert all(c.statistics is None for c in cols.values())
    assert read_parquet(t.store, path).equals(narrow)
