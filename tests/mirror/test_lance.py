"""A Lance mirror table (#46 part 4) on a local directory and on the S3 server: batches (inserts, updates,
deletes) committed once each, deletes as Lance deletion files (no data file rewritten), and plain readers
outside the project (``lance``, DuckDB and Polars through Arrow, a LanceDB nearest-neighbour query) reading
exactly the collection's rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.formats.lance.options import dataset_uri
from msgstream_spark.mirror.store import open_store
from tests.mirror.changes import FIELDS, delete, insert, model, table_state, to_arrow, upsert


class Where:
    def __init__(self, kind: str, tmp_path, s3=None) -> None:
        self.kind, self.tmp, self.s3 = kind, tmp_path, s3
        self.opts = s3.options() if s3 is not None else None

    def uri(self, name: str = "t") -> str:
        return self.s3.uri("lake", name) if self.s3 is not None else str(self.tmp / name)

    def lance_options(self) -> dict[str, str] | None:
        return None if self.opts is None else {**self.opts, "allow_http": "true"}


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> Where:
    return Where(request.param, tmp_path, request.getfixturevalue("s3") if request.param == "s3" else None)


def _open(where: Where, name: str = "t"):
    return open_table("lance", where.uri(name), collection="coll", pk="pk", arrow_schema=FIELDS,
                      storage_options=where.opts)


def _batches() -> list[list]:
    return [
        [insert(10, (1, "a"), (2, "b"), (3, "c"), (1, "a-dup"), (4, "d"), (7, "g"), (8, "h"))],
        [delete(20, 2), *upsert(30, (4, "d2")), insert(40, (5, "e"))],
        [*upsert(50, (1, "a2"), (6, "f")), delete(60, 3), insert(70, (2, "b-again"))],
    ]


def _dataset(where: Where, name: str = "t"):
    import lance

    return lance.dataset(dataset_uri(where.uri(name)), storage_options=where.lance_options())


def test_batches_commit_once_each_and_plain_readers_see_the_collections_rows(where):
    import duckdb
    import polars as pl

    t = _open(where)
    seen: list = []
    for i, batch in enumerate(_batches()):
        assert apply_batch(t, to_arrow(batch), "pk", "q", i) is True
        seen += batch
        assert table_state(t.to_arrow()) == model(seen), f"after batch {i}"
    versions = _dataset(where).version
    assert apply_batch(t, to_arrow(_batches()[1]), "pk", "q", 1) is False  # a re-run batch: skipped
    assert _dataset(where).version == versions and t.last_batch("q") == 2
    want = model(seen)
    ds = _dataset(where)
    assert table_state(ds.to_table()) == want
    got = duckdb.from_arrow(ds.to_table()).select("pk, v, _ts").fetchall()
    assert {r[0]: (r[1], r[2]) for r in got} == want
    frame = pl.from_arrow(ds.to_table(columns=["pk", "v", "_ts"]))
    assert {r["pk"]: (r["v"], r["_ts"]) for r in frame.to_dicts()} == want
    # deletes are Lance deletion files: every data file written once, none rewritten
    assert any(f.metadata.deletion_file is not None for f in ds.get_fragments())
    assert ds.schema.field("fv").type == pa.list_(pa.float32(), 2)
    # one Lance version per batch, carrying its batch record
    tx = ds.read_transaction(ds.version).transaction_properties
    assert tx["msgstream.query_id"] == "q" and tx["msgstream.batch_id"] == "2"


def test_a_reopened_table_skips_a_batch_it_holds_and_refuses_another_collection(where):
    from msgstream_spark.errors import MirrorError

    t = _open(where)
    assert apply_batch(t, to_arrow(_batches()[0]), "pk", "q", 0)
    again = _open(where)
    assert again.last_batch("q") == 0 and apply_batch(again, to_arrow(_batches()[0]), "pk", "q", 0) is False
    with pytest.raises(MirrorError, match="mirrors collection 'coll'"):
        open_table("lance", where.uri(), collection="other", pk="pk", arrow_schema=FIELDS,
                   storage_options=where.opts)


def test_a_nearest_neighbour_query_on_the_mirror_returns_the_exact_searchs_ids(tmp_path):
    """A Lance vector index built on the mirrored table (vectors are fixed-size lists); LanceDB's nearest
    neighbours equal an exact search over the collection's rows (the model's)."""
    import lancedb

    rng = np.random.default_rng(3)
    dim, n = 8, 600
    fields = pa.schema([pa.field("pk", pa.int64()), pa.field("fv", pa.list_(pa.float32(), dim))])
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    rows = pa.table({"op": ["insert"] * n, "pk": pa.array(range(n), pa.int64()),
                     "fv": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), dim),
                     "_ts": pa.array([10] * n, pa.int64())})
    changes = _changes(rows)
    t = open_table("lance", str(tmp_path / "v.lance"), collection="coll", pk="pk", arrow_schema=fields)
    assert apply_batch(t, changes, "pk", "q", 0)
    gone = list(range(0, n, 7))  # deleted keys must not come back from the index
    assert apply_batch(t, _changes(pa.table({"op": ["delete"] * len(gone), "pk": pa.array(gone, pa.int64()),
                                             "fv": pa.nulls(len(gone), fields.field("fv").type),
                                             "_ts": pa.array([20] * len(gone), pa.int64())})), "pk", "q", 1)
    live = np.array(sorted(set(range(n)) - set(gone)))
    import lance

    ds = lance.dataset(str(tmp_path / "v.lance"))
    ds.create_index("fv", index_type="IVF_FLAT", num_partitions=4, metric="l2")
    q = rng.normal(size=dim).astype(np.float32)
    exact = live[np.argsort(((vecs[live] - q) ** 2).sum(axis=1))[:10]]
    tbl = lancedb.connect(str(tmp_path)).open_table("v")
    got = tbl.search(q).metric("l2").nprobes(4).limit(10).to_arrow().column("pk").to_pylist()
    assert got == exact.tolist()


def test_vectors_of_variable_lists_become_fixed_size_lists_with_the_first_rows(tmp_path):
    """The collection's Arrow schema spells a vector as a variable list; the first rows fix its length."""
    fields = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string()), pa.field("fv", pa.list_(pa.float32()))])
    t = open_table("lance", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=fields)
    assert t.schema.field("fv").type == pa.list_(pa.float32())
    assert apply_batch(t, to_arrow(_batches()[0]), "pk", "q", 0)
    assert t.schema.field("fv").type == pa.list_(pa.float32(), 2) and t.last_batch("q") == 0
    assert apply_batch(t, to_arrow(_batches()[1]), "pk", "q", 1)
    assert table_state(t.to_arrow()) == model(_batches()[0] + _batches()[1])


def _changes(rows: pa.Table) -> pa.Table:
    """``rows`` (op, pk, fv, _ts) as the source's change rows (``_seq`` from the time and op, one partition)."""
    from tests.mirror.changes import seq_array

    n = rows.num_rows
    ts = rows.column("_ts").to_numpy().astype(np.uint64)
    seq = seq_array(ts, rows.column("op")[0].as_py())
    return rows.append_column("_seq", seq).append_column("_partition", pa.array([7] * n, pa.int64()))


def test_the_table_lives_in_the_store_given(where):
    t = _open(where)
    assert apply_batch(t, to_arrow(_batches()[0]), "pk", "q", 0)
    names = {m.uri.rsplit("/", 1)[-1] for m in open_store(where.uri(), where.opts, env={}).list(where.uri())}
    assert any(n.endswith(".lance") for n in names) and any(n.endswith(".manifest") for n in names)


def _fill_with_deletes(t) -> list:
    batches = [[insert(10, *[(p, f"a{p}") for p in range(40)])],
               [*upsert(20, (1, "b1"), (5, "b5")), delete(21, 7, 8)],
               [insert(25, *[(p, f"n{p}") for p in range(40, 60)])],
               [*upsert(30, (2, "c2"), (41, "c41")), delete(31, 50)]]
    for i, b in enumerate(batches):
        assert apply_batch(t, to_arrow(b), "pk", "q", i)
    return [m for b in batches for m in b]


def test_compaction_and_vacuum_are_lances_own_and_keep_the_rows_and_the_batch_records(where):
    """``mirror compact``: Lance's compact_files folds the deletion files and small fragments away (the rows
    stay, a later batch applies on the new fragments); ``vacuum`` with no retention: Lance's cleanup_old_versions
    removes what only older versions read, the key files of the fragments gone go too, nothing is left orphaned,
    and the batch records (exactly once) survive the versions that carried them."""
    from msgstream_spark.mirror.maintenance import compact, orphans, vacuum

    t = _open(where)
    seen = _fill_with_deletes(t)
    ds = _dataset(where)
    assert any(f.deletion_file() for f in ds.get_fragments()) and len(ds.get_fragments()) > 1
    done = compact(t)
    assert (done.files_in, done.files_out, done.deleted_rows, done.rows) == (len(ds.get_fragments()), 1, 7, 57)
    after = _dataset(where)
    assert len(after.get_fragments()) == 1 and not after.get_fragments()[0].deletion_file()
    assert table_state(after.to_table()) == model(seen)
    assert compact(t).files_in == 0  # nothing left to compact
    more = [*upsert(40, (3, "d3"), (42, "d42")), delete(41, 9)]
    assert apply_batch(t, to_arrow(more), "pk", "q", 4)  # looked up in the compacted fragment's key file
    seen += more
    assert table_state(_dataset(where).to_table()) == model(seen)
    store = open_store(where.uri(), where.opts, env={})
    lance_files = {m.uri for m in store.list(where.uri()) if m.uri.endswith(".lance")}
    gone = vacuum(t, retain_s=0)
    assert gone and all(p.endswith(".parquet") for p in gone)  # the key files of the fragments compacted away
    left = {m.uri for m in store.list(where.uri()) if m.uri.endswith(".lance")}
    live = {f.metadata.files[0].path for f in _dataset(where).get_fragments()}
    assert left < lance_files and {p.rsplit("/", 1)[-1] for p in left} == live  # Lance's cleanup
    assert orphans(t) == [] and len(_dataset(where).versions()) == 1
    again = _open(where)
    assert again.last_batch("q") == 4 and apply_batch(again, to_arrow(more), "pk", "q", 4) is False
    assert table_state(_dataset(where).to_table()) == model(seen)


def test_a_creation_cut_off_before_its_properties_is_finished_or_refused(tmp_path):
    """Lance makes a dataset, then its config is set (two versions): an empty table left without its properties
    gets them when opened; one holding a snapshot's rows without them is refused, naming what to do."""
    import lance

    from msgstream_spark.errors import MirrorError
    from msgstream_spark.mirror.common import table_schema

    empty = tmp_path / "empty"
    lance.write_dataset(table_schema(FIELDS, "pk").empty_table(), str(empty))  # killed before its config
    t = open_table("lance", str(empty), collection="coll", pk="pk", arrow_schema=FIELDS)
    assert t.properties()["msgstream.collection"] == "coll"
    assert apply_batch(t, to_arrow(_batches()[0]), "pk", "q", 0)
    rows = tmp_path / "rows"
    lance.write_dataset(t.to_arrow(), str(rows))
    with pytest.raises(MirrorError, match="has rows but no msgstream.collection property.*Remove the table"):
        open_table("lance", str(rows), collection="coll", pk="pk", arrow_schema=FIELDS)


def test_a_table_lance_itself_compacted_between_two_batches_is_read_as_it_left_it(tmp_path):
    """A user's own ``optimize.compact_files`` between two batches: its fragments have no key files; the next
    batch's lookup writes them and the batch applies on the compacted table."""
    import lance

    loc = tmp_path / "t"
    t = open_table("lance", str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)
    seen = _fill_with_deletes(t)
    lance.dataset(str(loc)).optimize.compact_files(materialize_deletions_threshold=0.0)
    more = [*upsert(40, (3, "d3"), (42, "d42")), delete(41, 9)]
    assert apply_batch(t, to_arrow(more), "pk", "q", 4)
    assert table_state(lance.dataset(str(loc)).to_table()) == model(seen + more)


def test_verify_and_repair_read_a_lance_table_at_one_version(where):
    """``mirror verify`` pins the Lance table at a version and compares it with the collection; ``--repair``
    commits the fix as a batch of its own; verify then passes."""
    from msgstream_spark.mirror.verify.run import repair, run_verify
    from tests.mirror.changes import HeldMilvus, fill, mixed_batches

    class NoLog:
        def newest_time(self, channels) -> int:
            return 5000 << 18

    t = _open(where)
    seen = fill(t, mixed_batches(2))
    milvus = HeldMilvus({pk: v for pk, (v, _) in model(seen).items()})
    assert run_verify(t, milvus, NoLog(), checkpoint=None).equal
    milvus.rows[3] = "changed in Milvus"
    del milvus.rows[4]
    got = run_verify(t, milvus, NoLog(), checkpoint=None)
    assert not got.equal and {(p["pk"], p["kind"]) for p in got.problems} == {(3, "stale"), (4, "extra")}
    assert repair(t, milvus, NoLog(), got, [])["keys"] == 2
    assert run_verify(_open(where), milvus, NoLog(), checkpoint=None).equal
