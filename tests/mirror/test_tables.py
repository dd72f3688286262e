"""Real Delta (delta-rs) and Iceberg (pyiceberg, SQL catalog on SQLite) tables fed change batches: the
table equals an independent model of Milvus's query, each batch applies once, bad tables are refused."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, collapse, open_table, snapshot_seq_array
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert, vector

FORMATS = ["delta", "iceberg", "lance"]


def _open(fmt, loc, **kw):
    kw.setdefault("collection", "coll")
    kw.setdefault("pk", "pk")
    kw.setdefault("arrow_schema", FIELDS)
    return open_table(fmt, str(loc), **kw)


def _golden() -> list[list]:
    """Micro-batches (in arrival order) covering each rule; batches are cut at timestamps."""
    return [
        [insert(10, (1, "a"), (2, "b"), (3, "c"), (1, "a-dup"), (4, "d"), (5, "e"))],
        [delete(20, 2), *reversed(upsert(30, (4, "d2"))),  # upsert's insert arrives before its delete
         insert(40, (3, "c2"), channel="chB"), delete(35, 3, channel="chA")],  # newer first, other channel
        [insert(50, (2, "b-again")), *upsert(60, (6, "f"), (7, "g"), (6, "f-dup")),  # re-insert after delete
         delete(70, 5, 1)],
        [*upsert(80, (2, "b3")), delete(80, 7), insert(90, (1, "a-back"))],
    ]


def _rows(t) -> dict:
    return table_state(t.to_arrow())


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_batches_and_a_restart_equal_the_model(fmt, tmp_path):
    batches = _golden()
    t = _open(fmt, tmp_path / "t")
    seen = []
    for i, batch in enumerate(batches):
        if i == 2:  # a restart: a new process opens the table where it is
            t = _open(fmt, tmp_path / "t")
        assert apply_batch(t, to_arrow(batch), "pk", "q1", i) is True
        seen += batch
        assert _rows(t) == model(seen), f"after batch {i}"
    assert _rows(t) == {1: ("a-back", 90), 2: ("b3", 80), 3: ("c2", 40), 4: ("d2", 30), 6: ("f", 60)}
    assert t.last_batch("q1") == 3
    out = t.to_arrow()
    assert set(out.column("_partition").to_pylist()) == {7}
    assert out.schema.field("_seq").type == pa.decimal128(38, 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_workload_over_many_batches(fmt, tmp_path):
    rng = np.random.default_rng(5)
    t = _open(fmt, tmp_path / "t")
    seen: list = []
    ts = 100
    for b in range(6):
        batch = []
        for _ in range(25):
            ts += 1
            pks = [int(p) for p in rng.integers(0, 40, rng.integers(1, 4))]
            rows = [(p, f"v{ts}.{k}") for k, p in enumerate(pks)]
            kind = rng.integers(0, 3)
            batch += [insert(ts, *rows)] if kind == 0 else [delete(ts, *pks)] if kind == 1 else upsert(ts, *rows)
        order = rng.permutation(len(batch))
        assert apply_batch(t, to_arrow([batch[i] for i in order]), "pk", "q", b)
        seen += batch
    assert _rows(t) == model(seen)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_already_in_the_table_is_skipped(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    assert apply_batch(t, to_arrow([insert(10, (1, "a"), (2, "b"))]), "pk", "q", 0)
    assert apply_batch(t, to_arrow([delete(20, 1)]), "pk", "q", 1)
    before = t.to_arrow()
    # the same batch ids again (a re-run after a crash), even with other content: nothing applied
    assert apply_batch(t, to_arrow([delete(20, 1)]), "pk", "q", 1) is False
    assert apply_batch(t, to_arrow([insert(30, (9, "z"))]), "pk", "q", 0) is False
    reopened = _open(fmt, tmp_path / "t")
    assert apply_batch(reopened, to_arrow([insert(30, (9, "z"))]), "pk", "q", 1) is False
    assert t.to_arrow().sort_by("pk").equals(before.sort_by("pk"))
    assert reopened.last_batch("q") == 1 and reopened.last_batch("other") is None
    # another query's batch 0 is its own
    assert apply_batch(reopened, to_arrow([insert(40, (3, "c"))]), "pk", "other", 0)
    assert _rows(reopened) == {2: ("b", 10), 3: ("c", 40)}


def test_delta_commits_carry_the_application_transaction(tmp_path):
    from deltalake import DeltaTable

    t = _open("delta", tmp_path / "t")
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "query-a", 4)
    dt = DeltaTable(str(tmp_path / "t"))
    assert dt.transaction_version("query-a") == 4
    last = dt.history(1)[0]
    assert last["operation"] == "MERGE" and last["msgstream.batch_id"] == "4"


def test_iceberg_snapshots_carry_query_and_batch(tmp_path):
    t = _open("iceberg", tmp_path / "t")
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "query-a", 4)
    apply_batch(t, to_arrow([delete(20, 1)]), "pk", "query-a", 5)
    tbl = t._table()
    tbl.refresh()
    summaries = [s.summary.additional_properties for s in tbl.snapshots()]
    assert {(s.get("msgstream.query_id"), s.get("msgstream.batch_id")) for s in summaries} == {
        ("query-a", "4"), ("query-a", "5")}


def _snapshot_file(loc, rows, snapshot_ts) -> str:
    """Parquet written elsewhere (as Spark tasks would): snapshot rows counting as changes at S."""
    os.makedirs(loc, exist_ok=True)
    n = len(rows)
    t = pa.table({"pk": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows],
                  "fv": pa.array([vector(r[1]) for r in rows], pa.list_(pa.float32())),
                  "_ts": pa.array([snapshot_ts] * n, pa.int64()), "_seq": snapshot_seq_array(snapshot_ts, n),
                  "_partition": pa.array([7] * n, pa.int64())})
    path = os.path.join(loc, "snapshot-part-0.parquet")
    pq.write_table(t, path)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_snapshot_files_then_changes_older_lose_newer_win(fmt, tmp_path):
    loc = str(tmp_path / "t")
    t = _open(fmt, loc, create=False, collection_id=42)
    path = _snapshot_file(loc, [(1, "s1"), (2, "s2"), (3, "s3")], 100)
    t.add_files([path], properties={"msgstream.snapshot_ts": "100", "msgstream.positions": '{"ch0": "AAA="}'})
    t = _open(fmt, loc, collection_id=42)
    assert t.properties()["msgstream.snapshot_ts"] == "100"
    assert t.properties()["msgstream.collection_id"] == "42"
    # replayed from the positions: changes before S (already in the snapshot) and after it
    batch = [insert(90, (1, "old")), delete(95, 2), upsert(100, (3, "at-s"))[1], insert(101, (2, "new")),
             delete(102, 3), insert(99, (4, "old-new-pk"))]
    assert apply_batch(t, to_arrow(batch), "pk", "q", 0)
    got = _rows(t)
    assert got == {1: ("s1", 100), 2: ("new", 101)}  # pk 4's insert at 99 is older than the snapshot
    # an older change loses to a snapshot row
    assert apply_batch(t, collapse(to_arrow([insert(99, (1, "older"))]), "pk"), "pk", "q", 1)
    assert _rows(t)[1] == ("s1", 100)


@pytest.mark.parametrize("fmt", FORMATS)
def test_replace_files_swaps_all_rows_and_properties_in_one_commit(fmt, tmp_path):
    """A new snapshot (issue #20, --snapshot when_needed) replaces a table that has snapshot and merged rows."""
    loc = str(tmp_path / "t")
    t = _open(fmt, loc, create=False, collection_id=42)
    t.add_files([_snapshot_file(loc, [(1, "s1"), (2, "s2")], 100)],
                properties={"msgstream.snapshot_ts": "100", "msgstream.mirror.start": "old"})
    assert apply_batch(t, to_arrow([insert(110, (3, "c")), delete(111, 1)]), "pk", "q", 0)
    assert _rows(t) == {2: ("s2", 100), 3: ("c", 110)}
    new = _snapshot_file(os.path.join(loc, "snap2"), [(2, "n2"), (5, "n5")], 500)
    t.replace_files([new], properties={"msgstream.snapshot_ts": "500", "msgstream.mirror.start": "new"})
    t = _open(fmt, loc, collection_id=42)
    assert _rows(t) == {2: ("n2", 500), 5: ("n5", 500)}
    props = t.properties()
    assert (props["msgstream.snapshot_ts"], props["msgstream.mirror.start"]) == ("500", "new")
    assert props["msgstream.collection_id"] == "42"
    # the stream continues on the new snapshot: older changes lose, newer win
    assert apply_batch(t, to_arrow([insert(400, (2, "old")), insert(501, (6, "f"))]), "pk", "q2", 0)
    assert _rows(t) == {2: ("n2", 500), 5: ("n5", 500), 6: ("f", 501)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_replace_files_that_fails_leaves_the_table_unchanged(fmt, tmp_path):
    loc = str(tmp_path / "t")
    t = _open(fmt, loc, collection_id=42)
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
    with pytest.raises(MirrorError):
        t.replace_files([], properties={"msgstream.snapshot_ts": "500"})
    t = _open(fmt, loc, collection_id=42)
    assert _rows(t) == {1: ("a", 10)}
    assert "msgstream.snapshot_ts" not in t.properties()


@pytest.mark.parametrize("fmt", FORMATS)
def test_another_collection_is_refused_and_nothing_written(fmt, tmp_path):
    loc = tmp_path / "t"
    t = _open(fmt, loc, collection_id=1)
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
    files = sorted(p for p in loc.rglob("*") if p.is_file())
    with pytest.raises(MirrorError, match="mirrors collection 'coll'.*not collection 'other'"):
        _open(fmt, loc, collection="other")
    with pytest.raises(MirrorError, match="primary key 'pk'.*primary key 'id'"):
        _open(fmt, loc, pk="id")
    other = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.int32()), pa.field("fv", pa.list_(pa.float32()))])
    with pytest.raises(MirrorError, match=r"column 'v' is (large_)?string in the table, int32 in 'coll'"):
        _open(fmt, loc, arrow_schema=other)
    with pytest.raises(MirrorError, match="dropped and re-created"):
        _open(fmt, loc, collection_id=2)
    assert sorted(p for p in loc.rglob("*") if p.is_file()) == files
    assert _rows(_open(fmt, loc)) == {1: ("a", 10)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_field_added_later_becomes_a_nullable_column(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
    grown = FIELDS.append(pa.field("extra", pa.int64()))
    t = _open(fmt, tmp_path / "t", arrow_schema=grown)
    assert t.schema.field("extra").nullable
    batch = to_arrow([insert(20, (2, "b"))]).append_column("extra", pa.array([5], pa.int64()))
    apply_batch(t, batch, "pk", "q", 1)
    rows = {r["pk"]: r["extra"] for r in t.to_arrow().to_pylist()}
    assert rows == {1: None, 2: 5}


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_collections_one_table_each(fmt, tmp_path):
    cat = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    kw = {"catalog_uri": cat} if fmt == "iceberg" else {}
    a = _open(fmt, tmp_path / "a", collection="alpha", **kw)
    b = _open(fmt, tmp_path / "b", collection="beta", **kw)
    apply_batch(a, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
    apply_batch(b, to_arrow([insert(10, (1, "b")), insert(11, (2, "bb"))]), "pk", "q", 0)
    assert _rows(_open(fmt, tmp_path / "a", collection="alpha", **kw)) == {1: ("a", 10)}
    assert _rows(_open(fmt, tmp_path / "b", collection="beta", **kw)) == {1: ("b", 10), 2: ("bb", 11)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_batches_of_thousands_of_keys(fmt, tmp_path):
    """Thousands of keys per batch: the lookup reads the key column, then _seq of the matching rows."""
    n = 2500
    t = _open(fmt, tmp_path / "t")
    first = [insert(10, *[(p, f"a{p}") for p in range(n)])]
    second = [*upsert(20, *[(p, f"b{p}") for p in range(0, n, 2)]), delete(21, *range(1, n, 4)),
              insert(22, *[(p, f"c{p}") for p in range(n, n + 300)])]
    apply_batch(t, to_arrow(first), "pk", "q", 0)
    apply_batch(t, to_arrow(second), "pk", "q", 1)
    assert _rows(t) == model(first + second)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_with_a_new_field_adds_its_column(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    apply_batch(t, to_arrow([insert(10, (1, "a"))]), "pk", "q", 0)
    batch = to_arrow([insert(20, (2, "b")), delete(21, 1)]).append_column("extra", pa.array(["x", None]))
    apply_batch(t, batch, "pk", "q", 1)
    assert t.schema.field("extra").nullable
    assert [(r["pk"], r["extra"]) for r in t.to_arrow().to_pylist()] == [(2, "x")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_varchar_key_binary_vector_json_and_the_dynamic_field(fmt, tmp_path):
    from msgstream_spark.mirror import seq_array

    fields = pa.schema([pa.field("key", pa.string()), pa.field("bv", pa.binary()), pa.field("j", pa.string()),
                        pa.field("$meta", pa.string()), pa.field("n", pa.int32())])
    t = _open(fmt, tmp_path / "t", pk="key", arrow_schema=fields)

    def batch(op, ts, keys, n=None):
        k = len(keys)
        ins = op == "insert"
        return pa.table({"op": [op] * k, "key": keys,
                         "bv": pa.array([bytes([len(x), ts]) if ins else None for x in keys], pa.binary()),
                         "j": pa.array(['{"t": %d}' % ts if ins else None for _ in keys], pa.string()),
                         "$meta": pa.array(['{"dyn": 1}' if ins else None for _ in keys], pa.string()),
                         "n": pa.array([n] * k, pa.int32()),
                         "_ts": pa.array([ts] * k, pa.int64()), "_seq": seq_array(np.full(k, ts, np.uint64), op),
                         "_partition": pa.array([1] * k, pa.int64())})

    apply_batch(t, batch("insert", 5, ["k1", "k2", "k3"]), "key", "q", 0)
    apply_batch(t, pa.concat_tables([batch("delete", 6, ["k2"]), batch("insert", 6, ["k2"], n=4),
                                     batch("delete", 7, ["k3"])]), "key", "q", 1)
    got = {r["key"]: (r["bv"], r["j"], r["$meta"], r["n"]) for r in t.to_arrow().to_pylist()}
    assert got == {"k1": (bytes([2, 5]), '{"t": 5}', '{"dyn": 1}', None),
                   "k2": (bytes([2, 6]), '{"t": 6}', '{"dyn": 1}', 4)}
    assert t.schema.field("key").nullable is False and t.schema.field("n").nullable


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_of_a_recreated_collection_are_refused(fmt, tmp_path):
    """A query following the name reads the re-created collection's rows (another ``_collection`` id):
    the batch fails naming both ids, nothing written; the old table keeps the old collection's state."""
    t = _open(fmt, tmp_path / "t", collection_id=1)
    first = to_arrow([insert(10, (1, "a"))])
    apply_batch(t, first.append_column("_collection", pa.array([1], pa.int64())), "pk", "q", 0)
    mixed = to_arrow([delete(20, 1), insert(21, (1, "new"))])
    mixed = mixed.append_column("_collection", pa.array([1, 2], pa.int64()))
    with pytest.raises(MirrorError, match=r"id 1; the batch holds rows of collection id\(s\) \[2\]"):
        apply_batch(t, mixed, "pk", "q", 1)
    assert _rows(t) == {1: ("a", 10)} and t.last_batch("q") == 0


def test_iceberg_table_partitioned_by_the_user(tmp_path):
    """A partitioned Iceberg table (identity on the key; bucket and truncate need pyiceberg-core).
    pyiceberg's upsert duplicated rows on those (iceberg-python 3758); the mirror deletes and appends in
    one transaction instead: the golden batches still equal the model."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    from msgstream_spark.mirror.common import identity_properties, table_schema
    from msgstream_spark.mirror.formats.iceberg.catalog import _catalog, _identifier

    loc = str(tmp_path / "t")
    cat = _catalog(loc, None)
    schema = table_schema(FIELDS, "pk")
    tbl = cat.create_table(_identifier("coll"), schema=schema, location=loc,
                           properties=identity_properties("coll", "pk", None))
    pk_id = tbl.schema().find_field("pk").field_id
    with tbl.update_spec() as spec:
        spec.add_field("pk", IdentityTransform(), "pk_part")
    t = _open("iceberg", loc)
    assert t._table().spec() != PartitionSpec() and isinstance(t._table().spec().fields[0], PartitionField)
    assert t._table().spec().fields[0].source_id == pk_id
    seen: list = []
    for i, batch in enumerate(_golden()):
        apply_batch(t, to_arrow(batch), "pk", "q", i)
        seen += batch
        assert _rows(t) == model(seen), f"after batch {i}"
    assert len(t._table().inspect.files()) > 1  # rows spread over several partitions' files


@pytest.mark.parametrize("fmt", FORMATS)
def test_snapshot_files_with_a_varchar_key_then_changes(fmt, tmp_path):
    """The key read back from the snapshot's Parquet (``string``) and a batch's key (Spark's Arrow:
    ``large_string``) are one type to the merge (Iceberg's join of the two failed)."""
    from msgstream_spark.mirror import seq_array

    loc = str(tmp_path / "t")
    os.makedirs(loc)
    schema = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("v", pa.string())])
    t = open_table(fmt, loc, collection="coll", pk="key", arrow_schema=schema, create=False)
    path = os.path.join(loc, "snapshot-part-0.parquet")
    pq.write_table(pa.table({"key": ["k1", "k2"], "v": ["s1", "s2"], "_ts": pa.array([100, 100], pa.int64()),
                             "_seq": snapshot_seq_array(100, 2), "_partition": pa.array([None, None], pa.int64())}),
                   path)
    t.add_files([path], properties={"msgstream.snapshot_ts": "100"})
    keys = pa.array(["k2", "k10", "k1"], pa.large_string())
    ts = np.array([101, 101, 99], np.uint64)
    batch = pa.table({"op": ["insert", "insert", "delete"], "key": keys, "v": pa.array(["n2", "n10", None],
                      pa.large_string()), "_ts": pa.array(ts.astype(np.int64)),
                      "_seq": pa.concat_arrays([seq_array(ts[:2], "insert"), seq_array(ts[2:], "delete")]),
                      "_partition": pa.array([1, 1, 1], pa.int64())})
    assert apply_batch(open_table(fmt, loc, collection="coll", pk="key", create=False), batch, "key", "q", 0)
    got = {r["key"]: r["v"] for r in t.to_arrow().to_pylist()}
    assert got == {"k1": "s1", "k2": "n2", "k10": "n10"}  # the delete at 99 is older than the snapshot


@pytest.mark.parametrize("fmt", FORMATS)
def test_user_fields_named_with_an_underscore_are_columns(fmt, tmp_path):
    """Milvus accepts field names such as ``_tag``: only the rows output's own metadata names are not fields."""
    from msgstream_spark.mirror import table_schema

    fields = FIELDS.append(pa.field("_tag", pa.string()))
    assert "_tag" in table_schema(fields.append(pa.field("_channel", pa.string())), "pk").names
    assert "_channel" not in table_schema(fields.append(pa.field("_channel", pa.string())), "pk").names
    t = _open(fmt, tmp_path / "t", arrow_schema=fields)
    batch = to_arrow([insert(10, (1, "a"), (2, "b"))])
    apply_batch(t, batch.append_column("_tag", pa.array(["x", "y"])), "pk", "q", 0)
    batch = to_arrow([insert(20, (3, "c"))])  # a later field (2.6 AlterCollection) named with "_" is added too
    apply_batch(t, batch.append_column("_tag", pa.array(["z"])).append_column("_later", pa.array([5])), "pk", "q", 1)
    got = sorted((r["pk"], r["_tag"], r["_later"]) for r in t.to_arrow().to_pylist())
    assert got == [(1, "x", None), (2, "y", None), (3, "z", 5)]
    assert "_channel" not in t.schema.names


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_first_version_that_fails_leaves_no_table(fmt, tmp_path):
    """The snapshot's first version is one commit: a file whose footer does not read (a failure between creating
    the table and adding its files) leaves no table, so the next run takes the snapshot again instead of finding
    an empty table without S or start positions and streaming from ``--starting``."""
    from msgstream_spark.jobs.mirror_start import _exists

    loc = tmp_path / "t"
    good = _snapshot_file(str(loc), [(1, "a"), (2, "b")], 100)
    bad = loc / "snapshot-part-1.parquet"
    bad.write_bytes(b"PAR1 not a parquet file")
    t = _open(fmt, loc, create=False)
    with pytest.raises(Exception, match="(?i)parquet|magic|footer|size"):
        t.add_files([good, str(bad)], properties={"msgstream.snapshot_ts": "100"})
    assert not _exists(_open(fmt, loc, create=False))
    bad.unlink()
    t = _open(fmt, loc, create=False)
    t.add_files([good], properties={"msgstream.snapshot_ts": "100"})
    assert t.properties()["msgstream.snapshot_ts"] == "100" and _rows(t) == {1: ("a", 100), 2: ("b", 100)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_that_changes_nothing_still_records_its_id(fmt, tmp_path):
    """Every merge commits its query and batch id, also one whose changes are all at or before S: a re-run of it
    is skipped, and the table names the query that took it."""
    loc = tmp_path / "t"
    t = _open(fmt, loc, create=False)
    t.add_files([_snapshot_file(str(loc), [(1, "a")], 100)], properties={"msgstream.snapshot_ts": "100"})
    assert apply_batch(t, to_arrow([insert(90, (1, "old")), delete(95, 2)]), "pk", "q", 0) is True
    assert t.last_batch("q") == 0 and t.merged_queries() == {"q"}
    assert apply_batch(t, to_arrow([insert(90, (1, "old"))]), "pk", "q", 0) is False
    assert apply_batch(t, to_arrow([]), "pk", "q", 1) is True and t.last_batch("q") == 1
    assert _rows(t) == {1: ("a", 100)}


def test_delta_commit_files_are_synced_before_they_are_published(tmp_path, monkeypatch):
    """The hand-written first version: its file reaches the disk before the link publishes it, and the log
    directory after (a power loss publishes all of it or nothing); a mount without hard links is a clear error."""
    import errno

    events = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def link(src, dst):
        events.append(("link", os.path.basename(dst)))
        return real_link(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    loc = tmp_path / "t"
    t = _open("delta", loc, create=False)
    t.add_files([_snapshot_file(str(loc), [(1, "a")], 100)], properties={})
    first = "00000000000000000000.json"
    assert [e for e in events if e[0] == "link"] == [("link", first)]
    i = events.index(("link", first))
    assert i > 0, events
    assert events[i - 1][0] == "fsync" and events[i - 1][1].startswith(f".{first}.")
    assert events[i + 1] == ("fsync", "_delta_log")

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted", src)

    monkeypatch.setattr(os, "link", no_links)
    loc2 = tmp_path / "u"
    t = _open("delta", loc2, create=False)
    with pytest.raises(MirrorError, match=r"cannot publish the Delta commit .*u/_delta_log/0+\.json.*hard link"):
        t.add_files([_snapshot_file(str(loc2), [(1, "a")], 100)], properties={})
    assert not [n for n in os.listdir(loc2 / "_delta_log") if n.endswith(".tmp")]


def test_iceberg_catalog_is_next_to_the_table_and_made_with_it(tmp_path):
    """Not inside the table's location (Iceberg's orphan-file removal deletes what no snapshot references
    there), and not made by merely looking for a table (a run refused as bad input leaves nothing)."""
    loc = tmp_path / "t"
    t = _open("iceberg", loc, create=False)
    with pytest.raises(MirrorError, match="no Iceberg table"):
        t.properties()
    assert list(tmp_path.iterdir()) == []
    t.add_files([_snapshot_file(str(loc), [(1, "a")], 100)], properties={"msgstream.snapshot_ts": "100"})
    assert (tmp_path / "t_catalog.sqlite").is_file() and not (loc / "catalog.sqlite").exists()
    assert _rows(_open("iceberg", loc, create=False)) == {1: ("a", 100)}
    old = tmp_path / "old"  # a table of an earlier release, its catalog inside the location, still opens
    old.mkdir()
    _open("iceberg", old, catalog_uri=f"sqlite:///{old}/catalog.sqlite")
    assert _open("iceberg", old, create=False).properties()["msgstream.collection"] == "coll"
    assert not (tmp_path / "old_catalog.sqlite").exists()


def test_delta_log_state_reads_a_checkpoint_with_deletion_vectors(tmp_path, monkeypatch):
    """A checkpoint (written by delta-rs, every CHECKPOINT_EVERY commits) keeps the deletion vectors and the
    batch ids: a new process starting from it removes the right vectors and skips committed batches."""
    from msgstream_spark.mirror.formats.delta import table as delta

    monkeypatch.setattr(delta, "CHECKPOINT_EVERY", 4)  # after the last batch below
    t = _open("delta", tmp_path / "t")
    seen = []
    for i in range(4):
        b = [insert(10 + 10 * i, *[(p, f"v{i}.{p}") for p in range(i, 30, 2)]), delete(15 + 10 * i, i + 3)]
        assert apply_batch(t, to_arrow(b), "pk", "q", i)
        seen += b
    assert (tmp_path / "t" / "_delta_log" / "_last_checkpoint").exists()
    t = _open("delta", tmp_path / "t")  # LogState from the checkpoint, then the commits after it
    assert apply_batch(t, to_arrow([insert(10, (99, "old"))]), "pk", "q", 3) is False
    more = [*upsert(100, (5, "x")), delete(101, 7), insert(102, (4, "y"))]
    assert apply_batch(t, to_arrow(more), "pk", "q", 4)
    assert _rows(t) == model(seen + more)


LEGACY = {  # Delta PROTOCOL.md, "Table Features": the features a legacy (reader, writer) version supports
    (1, 4): ([], ["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"]),
    (1, 5): ([], ["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"]),
    (1, 6): ([], ["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns",
                  "identityColumns"]),
    (2, 5): (["columnMapping"], ["appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                                 "generatedColumns", "columnMapping"]),
    (2, 6): (["columnMapping"], ["appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                                 "generatedColumns", "columnMapping", "identityColumns"]),
}


@pytest.mark.parametrize(("reader", "writer"), sorted(LEGACY))
def test_deletion_vectors_on_a_table_of_a_legacy_protocol_keep_its_features(reader, writer, tmp_path):
    """#38 item 7: a Delta table created (by delta-rs) at reader 1-2 / writer 4-6 moves to reader 3 / writer 7
    with the first batch that deletes: the features its versions supported are listed (columnMapping, a
    reader-writer feature, needs reader 2 and writer 5) with deletionVectors; delta-rs and Polars read it."""
    import deltalake
    import polars as pl

    from msgstream_spark.mirror.common import identity_properties, table_schema

    loc = str(tmp_path / "t")
    conf = {**identity_properties("coll", "pk", None), "delta.minReaderVersion": str(reader),
            "delta.minWriterVersion": str(writer)}
    deltalake.DeltaTable.create(loc, table_schema(FIELDS, "pk"), configuration=conf, name="coll",
                                raise_if_key_not_exists=False)
    assert deltalake.DeltaTable(loc).protocol().min_writer_version == writer
    t = _open("delta", loc)
    seen: list = []
    for i, batch in enumerate(_golden()):
        assert apply_batch(t, to_arrow(batch), "pk", "q", i)
        seen += batch
    proto = deltalake.DeltaTable(loc).protocol()
    want_reader, want_writer = LEGACY[(reader, writer)]
    assert (proto.min_reader_version, proto.min_writer_version) == (3, 7)
    assert sorted(proto.reader_features) == sorted(want_reader + ["deletionVectors"])
    assert sorted(proto.writer_features) == sorted(want_writer + ["deletionVectors"])
    dt = deltalake.DeltaTable(loc)
    got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT pk, v, _ts, fv FROM t").read_all())
    assert table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                           for f in got.schema]))) == model(seen)
    if reader == 1:
        assert table_state(pl.read_delta(loc).to_arrow()) == model(seen)
    else:  # Polars reads no column-mapping table, before the upgrade (reader 2) or after (the feature listed)
        with pytest.raises(Exception, match="(?i)column ?mapping"):
            pl.read_delta(loc)


@pytest.mark.parametrize("fmt", FORMATS)
def test_to_arrow_reads_only_the_columns_asked(fmt, tmp_path):
    """``to_arrow(columns)`` (the mirror's DropPartition / Truncate deletes read the keys with their partitions or
    times this way): the live rows' values of those columns only, deletes applied, as the whole read has them."""
    t = _open(fmt, tmp_path / "t")
    for i, batch in enumerate(_golden()):
        assert apply_batch(t, to_arrow(batch), "pk", "q1", i) is True
    whole = t.to_arrow()
    for cols in (["pk", "_partition"], ["pk", "_ts"]):
        got = t.to_arrow(cols)
        assert got.column_names == cols
        assert sorted(got.to_pylist(), key=lambda r: r["pk"]) == sorted(whole.select(cols).to_pylist(),
                                                                          key=lambda r: r["pk"])
    assert sorted(t.to_arrow(["pk"]).column("pk").to_pylist()) == [1, 2, 3, 4, 6]
