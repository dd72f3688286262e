"""What a writing task waits for on a local path: its data file and the claim of its name are fsync'd (a commit
names the one, a lost task's cleanup reads the other), its changes file (the batch's state between its stages: a
crash re-runs the batch) and its key index (a cache every lookup checks, rebuilt when damaged) are moved into place
whole without an fsync; a file's directory is made only when it is missing. The transient puts keep the store's
contract on every store (whole or nothing to readers)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.store import open_store
from msgstream_spark.mirror.store.parquet import ParquetOut, key_stats, read_parquet
from msgstream_spark.mirror.write.keyindex import KeyIndex, side_path
from msgstream_spark.mirror.write.layout import TaskWriter
from msgstream_spark.mirror.write.taskplan import ChangesFile, changes_dir, changes_files, claims_dir, data_files
from tests.mirror.changes import FIELDS, insert, to_arrow


class _Syncs:
    """Every fsync of this process, by what it synced (a directory or a file's final name)."""

    def __init__(self, monkeypatch) -> None:
        self.paths: list[str] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            d, name = os.path.split(path)
            if name.startswith(".") and name.endswith(".tmp"):  # a file synced before its rename: its final name
                path = os.path.join(d, name[1:].rsplit(".", 2)[0])
            self.paths.append(path)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


def test_a_writing_task_fsyncs_its_data_file_and_claim_only(tmp_path, monkeypatch):
    t = open_table("delta", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    spec = t.write_spec()
    at = changes_dir(spec.data_dir, "q", 0)
    syncs = _Syncs(monkeypatch)
    w = TaskWriter(spec, claims=claims_dir(at))
    ch = ChangesFile(w.store, at, spec.key_type)
    ch.add(w.add(to_arrow([insert(10, (1, "a"), (2, "b"), (3, "c"))])))
    written = ch.close(w.close())
    monkeypatch.undo()
    [data], [changes] = data_files(written), changes_files(written)
    claim = os.path.join(claims_dir(at), os.path.basename(data))
    # the data file and its directory (its rename), the claim's directory (an empty file created in place); no
    # temporary file's fsync, none for the changes file, none for the key index (8 fsyncs before)
    assert sorted(syncs.paths) == sorted([data, os.path.dirname(data), os.path.dirname(claim)])
    # every file whole, where its readers look
    assert os.path.getsize(claim) == 0
    assert read_parquet(t.store, changes).column("key").to_pylist() == [1, 2, 3]
    assert pq.read_table(data).column("pk").to_pylist() == [1, 2, 3]
    assert KeyIndex.load(side_path(data), data, 3, os.path.getsize(data)) is not None
    leftovers = [n for d, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]
    assert leftovers == []


def test_a_directory_is_made_when_missing_only(tmp_path, monkeypatch):
    store = open_store(str(tmp_path / "s"))
    made: list[str] = []
    real = os.makedirs
    monkeypatch.setattr(os, "makedirs", lambda p, *a, **k: (made.append(p), real(p, *a, **k))[1])
    for i in range(3):
        store.put(store.join("a", "b", f"{i}.keys"), b"x")
        store.put_transient(store.join("a", "c", f"{i}.keys"), b"y")
        with ParquetOut(store, store.join("a", "d", f"{i}.parquet"), pa.schema([("k", pa.int64())]),
                        transient=bool(i % 2)) as out:
            out.write_table(pa.table({"k": [i]}))
            out.close()
    leaves = [p for p in made if os.path.dirname(p) == str(tmp_path / "s" / "a")]  # (makedirs recurses upward)
    assert sorted(leaves) == sorted(str(tmp_path / "s" / "a" / d) for d in "bcd")  # once each, not once a file
    os.rename(tmp_path / "s" / "a", tmp_path / "gone")  # removed meanwhile (a batch's directory cleared): made again
    store.put(store.join("a", "b", "again"), b"z")
    assert store.read(store.join("a", "b", "again")) == b"z"


def test_an_empty_put_creates_in_place_and_replaces_whole(tmp_path, monkeypatch):
    store = open_store(str(tmp_path / "s"))
    u = store.join("claims", "x.parquet")
    syncs = _Syncs(monkeypatch)
    first = store.put(u, b"")
    assert syncs.paths == [str(tmp_path / "s" / "claims")]  # its directory only
    assert store.read(u) == b"" and store.head(u).etag == first.etag
    second = store.put(u, b"")  # there already: replaced as any put (a new inode, a new etag)
    third = store.put(u, b"full")
    assert store.read(u) == b"full" and len({first.etag, second.etag, third.etag}) == 3
    assert not [n for n in os.listdir(tmp_path / "s" / "claims") if n.endswith(".tmp")]


def test_transient_puts_keep_the_contract(store):
    u = store.join("_keys", "f.parquet.keys")
    a = store.put_transient(u, b"one")
    b = store.put_transient(u, b"two, longer")
    assert store.read(u) == b"two, longer" and a.etag != b.etag
    data = pa.table({"k": np.arange(1000)})
    target = store.join("_changes", "q-0", "e1", "c.parquet")
    with pytest.raises(RuntimeError):
        with ParquetOut(store, target, data.schema, transient=True) as out:
            out.write_table(data)
            raise RuntimeError("the task failed mid-file")
    assert store.head(target) is None  # nothing published
    with ParquetOut(store, target, data.schema, transient=True) as out:
        out.write_table(data)
        got = out.close()
    assert got.rows == 1000 and read_parquet(store, target).equals(data)


def test_a_files_key_bounds_are_its_key_columns_behind_a_struct(tmp_path):
    """The bounds a commit records (and the plan prunes by) are the key column's, also when a struct column comes
    before it (a Milvus 2.6 struct array: one Parquet leaf per member, so the key's Arrow field index named the
    struct's second member before)."""
    store = open_store(str(tmp_path / "s"))
    member = pa.struct([("a", pa.int64()), ("b", pa.int64())])
    t = pa.table({"op": ["insert"] * 3, "s": pa.array([[{"a": 100, "b": 200}]] * 3, pa.list_(member)),
                  "pk": [7, 3, 5]})
    with ParquetOut(store, store.join("f.parquet"), t.schema, "pk") as out:
        out.write_table(t, row_group_size=2)
        got = json.loads(out.close().stats)
    assert got == {"numRecords": 3, "minValues": {"pk": 3}, "maxValues": {"pk": 7}, "nullCount": {"pk": 0}}
    assert key_stats(pq.ParquetFile(tmp_path / "s" / "f.parquet").metadata, "s") == {"numRecords": 3}


def test_a_whole_file_read_is_the_file(tmp_path):
    """``read_parquet`` (whole: ``ParquetFile.read``, not ``pq.read_table``) returns the table written: several row
    groups, nulls, a dictionary column, the schema's metadata."""
    store = open_store(str(tmp_path / "s"))
    t = pa.table({"k": pa.array([1, None, 3, 4]), "s": pa.array(["a", "b", None, "a"]).dictionary_encode(),
                  "v": pa.array([[1.0], None, [2.0, 3.0], []], pa.list_(pa.float32()))}).replace_schema_metadata(
        {"x": "y"})
    with ParquetOut(store, store.join("f.parquet"), t.schema) as out:
        out.write_table(t, row_group_size=3)
        out.close()
    got = read_parquet(store, store.join("f.parquet"))
    assert got.equals(pq.read_table(tmp_path / "s" / "f.parquet")) and got.num_rows == 4
    assert got.schema.metadata[b"x"] == b"y" and got.column("k").to_pylist() == [1, None, 3, 4]
