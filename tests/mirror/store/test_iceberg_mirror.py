"""The mirror's Iceberg table through catalogs users run, its warehouse in object storage: a SQL catalog on the
real PostgreSQL with the table on the S3 server, a REST catalog (lakana-server) that assigns the table's location,
and (where the code branches) the local default. Batches applied by the mirror's write path (``apply_batch``),
compacted and vacuumed, and, where exact files matter, committed by the table's own commit with a task's file
written here through the table's store; what the mirror wrote is read back by readers that share none of its
code: a separately loaded pyiceberg catalog, Polars and DuckDB's iceberg extension."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.errors import ConfigError, MirrorError
from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.common import conform, table_schema
from msgstream_spark.mirror.formats.base import Plan
from msgstream_spark.mirror.store import uri
from msgstream_spark.mirror.store.settings import for_pyiceberg
from msgstream_spark.mirror.table import open_existing
from tests.fixtures.plain_readers import duckdb_on_s3
from tests.mirror.changes import FIELDS, table_state, to_arrow, upsert
from tests.mirror.store.racing import race

PW = "pw-Secret-4711"


def _env_catalog(monkeypatch, name: str, props: dict[str, str]) -> None:
    for k, v in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__{k.upper().replace('.', '__').replace('-', '_')}", v)


@pytest.fixture
def lake(request, s3, monkeypatch, tmp_path):
    """(location, open_table keyword arguments, a plain pyiceberg handle on the table) in each place: a local
    directory with the default catalog, or the S3 server with a SQL catalog on PostgreSQL named ``lake`` (a plain
    reader loads a SQL catalog under the name its rows are kept by)."""
    from pyiceberg.catalog import load_catalog

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # no .pyiceberg.yaml of the machine's user
    if request.param == "local":
        loc = str(tmp_path / "books")
        return loc, {}, lambda: load_catalog("msgstream", type="sql", uri=f"sqlite:///{loc}_catalog.sqlite")\
            .load_table(("msgstream", "coll"))
    db = request.getfixturevalue("postgres_db")
    _env_catalog(monkeypatch, "lake", {"type": "sql", "uri": db})
    return s3.uri("lake", "books"), {"catalog": "lake", "storage_options": s3.options()}, lambda: load_catalog(
        "lake", type="sql", uri=db, **for_pyiceberg(s3.options())).load_table(("msgstream", "books"))


def _commit(t, changes: pa.Table, deletes: dict[str, list[int]], qid: str, bid: int) -> Plan:
    """One batch as the write path commits it: the inserted rows in a new data file that a task writes through
    the table's store, and ``deletes`` (live data file -> positions), planned on the snapshot read now."""
    base = t.live_files().version
    spec = t.write_spec()
    adds = []
    rows = changes.filter(pa.compute.equal(changes.column("op"), "insert"))
    if rows.num_rows:
        adds.append(uri.join(spec.data_dir, f"{uuid.uuid4().hex}.parquet"))
        with t.store.open_output(adds[0]) as out:
            pq.write_table(conform(rows, spec.schema), out)
    plan = Plan(adds, {p: np.array(v, np.uint64) for p, v in deletes.items()}, changes.num_rows, base)
    assert t.commit(plan, query_id=qid, batch_id=bid)
    return plan


def _fill(t) -> tuple[dict, str]:
    """Two batches: keys 1-4 inserted; then 2 and 3 updated (their old rows deleted by position), 4 deleted.
    (the model of Milvus's query after them, the data file of the first batch)."""
    first = _commit(t, to_arrow([*upsert(10, (1, "a"), (2, "b"), (3, "c"), (4, "d"))]), {}, "q", 0).adds[0]
    _commit(t, to_arrow([*upsert(20, (2, "b2"), (3, "c2"))]), {first: [1, 2, 3]}, "q", 1)
    return {1: ("a", 10), 2: ("b2", 20), 3: ("c2", 20)}, first


@pytest.mark.parametrize("lake", ["local", "s3"], indirect=True)
def test_batches_compaction_inputs_and_vacuum_lists_in_the_store(lake):
    loc, kw, plain = lake
    t = open_table("iceberg", loc, collection="coll", pk="pk", arrow_schema=FIELDS, **kw)
    want, first = _fill(t)
    assert table_state(t.to_arrow()) == want

    live = t.live_files()
    by_path = {f.path: f for f in live}
    assert first in by_path and by_path[first].deleted.tolist() == [1, 2, 3]
    for f in live:  # the store's spelling (a URI, or a plain path for a local table), the size the store has
        assert f.path.startswith("s3://" if "catalog" in kw else "/")
        assert f.size == t.store.head(f.path).size > 0
    tbl = t._table()
    tbl.refresh()
    named = [e.data_file.file_path for s in tbl.snapshots() for m in s.manifests(tbl.io)
             for e in m.fetch_manifest_entry(tbl.io)]
    assert named and all(p.startswith(("s3://", "file:///")) for p in named)  # full URIs in the manifests
    [delete_file] = [p for p in named if "/data/delete-" in p]
    got = pq.read_table(pa.BufferReader(t.store.read(t.store.join("data", delete_file.rsplit("/", 1)[-1]))))
    assert got.column("file_path").to_pylist() == [t._names[first]] * 3  # the data file as its manifest names it
    assert got.column("pos").to_pylist() == [1, 2, 3]

    stored = {m.uri for m in t.store.list(t.root)}
    assert t.referenced_files() <= stored  # what vacuum keeps is named as the store lists it
    meta = t.metadata_files()
    assert meta and set(meta) <= stored and any(p.endswith(".metadata.json") for p in meta)
    assert t.retained_files(7 * 86400, time.time()) <= stored
    assert table_state(plain().scan().to_arrow()) == want
    again = open_existing("iceberg", loc, **kw)  # maintenance opens it by its stored identity
    assert again.collection == "coll" and again.last_batch("q") == 1


def _readers(tbl, opts: dict[str, str], monkeypatch) -> list[dict]:
    """The rows three readers that share none of the mirror's code see."""
    import polars as pl

    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # polars_iceberg (its faster planner) not installed
    out = [table_state(tbl.scan().to_arrow()), table_state(pl.scan_iceberg(tbl, storage_options=opts).collect()
                                                           .to_arrow())]
    con = duckdb_on_s3(opts, ("httpfs", "avro", "iceberg"))
    cols = ", ".join(f.name for f in table_schema(FIELDS, "pk"))
    sql = f"SELECT {cols} FROM iceberg_scan('{tbl.metadata_location}')"
    out.append(table_state(con.execute(sql).fetch_arrow_table()))
    return out


def test_rest_catalog_assigns_the_location_the_mirror_takes_it(rest_catalog, s3, monkeypatch, tmp_path):
    env_name = f"e{uuid.uuid4().hex[:10]}"
    rest_catalog.new_environment(env_name, s3.uri("wh"), for_pyiceberg(s3.options()))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    _env_catalog(monkeypatch, "rest", {"type": "rest", "uri": rest_catalog.uri, "token": rest_catalog.token,
                                       "prefix": env_name})
    t = open_table("iceberg", "bronze.books", collection="coll", pk="pk", arrow_schema=FIELDS, catalog="rest",
                   storage_options=s3.options(), create=False)  # by identifier: made as soon as it has a schema
    assert t.location.startswith(f"s3://{s3.bucket}/wh/managed/bronze/books-")
    assert t.write_spec().data_dir == t.location + "/data"
    want, _ = _fill(t)
    again = open_existing("iceberg", "bronze.books", catalog="rest", storage_options=s3.options())
    assert again.location == t.location and table_state(again.to_arrow()) == want

    from pyiceberg.catalog.rest import RestCatalog

    plain = RestCatalog("other", uri=rest_catalog.uri, token=rest_catalog.token, prefix=env_name,
                        **for_pyiceberg(s3.options()))
    assert all(got == want for got in _readers(plain.load_table(("bronze", "books")), s3.options(), monkeypatch))

    # a snapshot's files (written before the catalog placed the table) become a new table named by identifier
    staged = uri.join(s3.uri("staging"), "snap.parquet")
    with t.store.open_output(staged) as out:  # (the same bucket: the store of a file outside the table's)
        pq.write_table(conform(to_arrow(upsert(5, (9, "s"))[1:]), table_schema(FIELDS, "pk")), out)
    snap = open_table("iceberg", "gold.snap", collection="coll", pk="pk", catalog="rest", create=False,
                      storage_options=s3.options())
    snap.add_files([staged], properties={"msgstream.snapshot": "5"})
    assert snap.location.startswith(f"s3://{s3.bucket}/wh/managed/gold/snap-")
    assert table_state(snap.to_arrow()) == {9: ("s", 5)} and snap.properties()["msgstream.snapshot"] == "5"

    with pytest.raises(ConfigError) as e:  # the server's own rules come back as its error, the token masked
        open_table("iceberg", "msgstream.books", collection="coll", pk="pk", arrow_schema=FIELDS, catalog="rest",
                   storage_options=s3.options())
    assert "rest" in str(e.value) and rest_catalog.token not in str(e.value)


def test_two_writers_race_through_the_catalog_one_commit_wins(s3, postgres_db, monkeypatch, tmp_path):
    """Two mirror processes' tables (each its own catalog connection) plan a batch on the same snapshot and
    commit at once: the catalog takes one; the other is refused, nothing of it committed (no duplicate key)."""
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    _env_catalog(monkeypatch, "lake", {"type": "sql", "uri": postgres_db})
    kw = {"collection": "coll", "pk": "pk", "arrow_schema": FIELDS, "catalog": "lake",
          "storage_options": s3.options()}
    loc = s3.uri("lake", "books")
    a = open_table("iceberg", loc, **kw)
    _, first = _fill(a)
    b = open_table("iceberg", loc, **kw)
    plans = []
    for t, v in ((a, "from-a"), (b, "from-b")):  # each: key 1 updated (its row in the first file deleted)
        base = t.live_files().version
        path = uri.join(t.write_spec().data_dir, f"{uuid.uuid4().hex}.parquet")
        with t.store.open_output(path) as out:
            pq.write_table(conform(to_arrow(upsert(30, (1, v))[1:]), t.write_spec().schema), out)
        plans.append((t, Plan([path], {first: np.array([0], np.uint64)}, 1, base)))
    won, lost = race([lambda t=t, p=p, i=i: t.commit(p, query_id=f"q{i}", batch_id=0)
                      for i, (t, p) in enumerate(plans)], MirrorError)
    assert won == [True] and len(lost) == 1
    assert "nothing committed" in str(lost[0])
    rows = open_table("iceberg", loc, **kw).to_arrow()
    assert sorted(rows.column("pk").to_pylist()) == [1, 2, 3]  # key 1 once: one writer's row
    assert table_state(rows)[1][0] in ("from-a", "from-b")


def test_catalog_arguments_refused_or_masked(s3, postgres_db, monkeypatch, tmp_path):
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="--catalog NAME"):  # a table in object storage needs a catalog
        open_table("iceberg", s3.uri("t"), collection="c", pk="pk", arrow_schema=FIELDS,
                   storage_options=s3.options())
    with pytest.raises(ConfigError, match="namespace.table"):
        open_table("iceberg", "books", collection="c", pk="pk", arrow_schema=FIELDS, catalog="lake",
                   catalog_options={"type": "sql", "uri": postgres_db})
    bad = postgres_db.replace("postgres@", f"postgres:{PW}@").rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(ConfigError) as e:
        open_table("iceberg", s3.uri("t"), collection="c", pk="pk", arrow_schema=FIELDS, catalog="lake",
                   catalog_options={"type": "sql", "uri": bad}, storage_options=s3.options())
    assert "'lake'" in str(e.value) and PW not in str(e.value) and s3.options()["aws_secret_access_key"] not in \
        str(e.value)
    _env_catalog(monkeypatch, "lake", {"type": "sql", "uri": postgres_db})
    kw = {"collection": "c", "pk": "pk", "arrow_schema": FIELDS, "catalog": "lake", "storage_options": s3.options()}
    open_table("iceberg", s3.uri("a", "books"), **kw)
    with pytest.raises(MirrorError, match=r"has table msgstream.books at s3://.*/a/books, not at .*/b/books: give "
                                          r"--table msgstream.books"):
        open_table("iceberg", s3.uri("b", "books"), **kw)


def test_a_writers_record_hides_catalog_secrets_from_its_command_line(tmp_path, monkeypatch):
    """The lease names its holder's command (for the refusal another writer gets): the catalog's password, token
    and REST credential given as --catalog-option never appear in it."""
    from msgstream_spark.mirror.store import Lease, LeaseHeld, open_store

    monkeypatch.setattr("sys.argv", ["msgstream", "mirror", "run", "--catalog", "lake", "--catalog-option",
                                     f"uri=postgresql+psycopg2://me:{PW}@db/lake", "--catalog-option",
                                     f"token={PW}1", "--catalog-option", f"credential=client:{PW}2"])
    store = open_store(str(tmp_path / "t"))
    held = Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    try:
        with pytest.raises(LeaseHeld) as e:
            Lease(store, store.root, "compact", auto_renew=False).acquire()
        record = store.read(held.uri).decode()
        for text in (str(e.value), record):
            assert "--catalog lake" in text and PW not in text
    finally:
        held.release()


# the REST parameter starts lakana: the worker group that shares one server (tests/conftest.py)
@pytest.fixture(params=["postgresql", pytest.param("rest", marks=pytest.mark.xdist_group("rest-catalog"))])
def catalog_on_s3(request, s3, monkeypatch, tmp_path):
    """(--table, open_table keyword arguments, a plain pyiceberg handle) of a table on the S3 server in a SQL
    catalog on PostgreSQL (by location) or in lakana's REST catalog (by identifier: the server places it)."""
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    kw = {"storage_options": s3.options()}
    if request.param == "postgresql":
        from pyiceberg.catalog import load_catalog

        db = request.getfixturevalue("postgres_db")
        _env_catalog(monkeypatch, "lake", {"type": "sql", "uri": db})
        return s3.uri("lake", "books"), {**kw, "catalog": "lake"}, lambda: load_catalog(
            "lake", type="sql", uri=db, **for_pyiceberg(s3.options())).load_table(("msgstream", "books"))
    from pyiceberg.catalog.rest import RestCatalog

    rest = request.getfixturevalue("rest_catalog")
    env_name = f"e{uuid.uuid4().hex[:10]}"
    rest.new_environment(env_name, s3.uri("wh"), for_pyiceberg(s3.options()))
    _env_catalog(monkeypatch, "rest", {"type": "rest", "uri": rest.uri, "token": rest.token, "prefix": env_name})
    return "silver.books", {**kw, "catalog": "rest"}, lambda: RestCatalog(
        "other", uri=rest.uri, token=rest.token, prefix=env_name, **for_pyiceberg(s3.options())).load_table(
        ("silver", "books"))


def test_the_mirror_applies_compacts_and_vacuums_a_table_on_s3(catalog_on_s3, s3, monkeypatch):
    from msgstream_spark.mirror import apply_batch
    from msgstream_spark.mirror.maintenance import compact, orphans, vacuum
    from tests.mirror.changes import delete, insert, model

    table, kw, plain = catalog_on_s3
    t = open_table("iceberg", table, collection="coll", pk="pk", arrow_schema=FIELDS, **kw)
    batches = [[insert(10, *[(p, f"a{p}") for p in range(40)])],
               [*upsert(20, *[(p, f"b{p}") for p in range(0, 40, 3)]), delete(21, *range(1, 40, 7))],
               [*upsert(30, *[(p, f"c{p}") for p in range(0, 40, 5)]), insert(31, (60, "x")), delete(32, 2)]]
    seen: list = []
    for i, b in enumerate(batches):
        assert apply_batch(t, to_arrow(b), "pk", "q", i)
        seen += b
    want = model(seen)
    assert any(task.delete_files for task in plain().scan().plan_files())  # merge-on-read: position deletes
    before = {f.path for f in t.live_files() if len(f.deleted)}  # what a compaction rewrites
    done = compact(t, 1 << 20)
    assert done.files_in == len(before) == 2 and done.files_out == 1 and done.deleted_rows > 0
    assert not any(task.delete_files for task in plain().scan().plan_files())
    assert orphans(t) == []
    if kw["catalog"] == "rest":  # lakana expires snapshots itself ('lakana table maintain'), never by a commit
        with pytest.raises(MirrorError, match=r"the catalog refused expiring \d+ snapshot\(s\) \(vacuum: nothing "
                                              r"deleted\): ForbiddenError"):
            vacuum(t, retain_s=0)
        assert all(t.store.head(p) for p in before)
    else:
        gone = vacuum(t, retain_s=0)
        assert before <= set(gone) and not any(t.store.head(p) for p in before)
        keys = [o["Key"] for o in s3.server.boto3().list_objects_v2(Bucket=s3.bucket)["Contents"]]
        assert not any("/data/delete-" in k for k in keys)  # the position-delete files went with their snapshot
        assert all(k.startswith("lake/books/") for k in keys)  # data, manifests, metadata: all in the bucket
    assert all(got == want for got in _readers(plain(), s3.options(), monkeypatch))
    assert apply_batch(t, to_arrow([delete(40, 0)]), "pk", "q", 3)  # and the mirror goes on
    assert table_state(plain().scan().to_arrow()) == {k: v for k, v in want.items() if k != 0}


def test_a_deposed_writers_commit_is_refused_by_the_catalog(catalog_on_s3, monkeypatch):
    """#45 item 1 in catalogs users run: writer A planned batch 1 and passed every check of its commit, then
    stalls right before the catalog commit; B takes the lease over and publishes its epoch. The epoch comes with
    a snapshot of its own, because a catalog checks a commit's requirements and none names a property (a REST
    catalog applies a commit whose asserted snapshot is still the head): A's commit, asserting the head it
    planned on, is refused, and pyiceberg's retry is refused by our producer. B's batch lands; readers see both
    batches once."""
    from msgstream_spark.mirror import apply_batch
    from msgstream_spark.mirror.formats.iceberg import table as iceberg_table
    from msgstream_spark.mirror.write.batch import commit_plan
    from tests.mirror.changes import model
    from tests.mirror.writers import BATCHES, Clock, planned

    table, kw, plain = catalog_on_s3
    t_a = open_table("iceberg", table, collection="coll", pk="pk", arrow_schema=FIELDS, **kw)
    assert apply_batch(t_a, to_arrow(BATCHES[0]), "pk", "q", 0)
    clock = Clock()
    hold_a = clock.hold(t_a.store, t_a.location, "writer A")
    p = planned(t_a, BATCHES[1])
    real, holds = iceberg_table.commit_files, []

    def stalled(*args, **more):
        if not holds:
            clock.now += 61
            holds.append(clock.hold(t_a.store, t_a.location, "writer B"))
            holds[0].fence(open_table("iceberg", table, collection="coll", pk="pk", **kw))
        return real(*args, **more)

    monkeypatch.setattr(iceberg_table, "commit_files", stalled)
    with pytest.raises(MirrorError, match=rf"moved from snapshot {p.base}, which batch 1 of query q was planned on"):
        commit_plan(t_a, p, set(), query_id="q", batch_id=1, hold=hold_a)
    monkeypatch.setattr(iceberg_table, "commit_files", real)
    assert table_state(plain().scan().to_arrow()) == model(BATCHES[0])
    t_b = open_table("iceberg", table, collection="coll", pk="pk", **kw)
    assert t_b.writer_epoch() == holds[0].epoch == hold_a.epoch + 1
    assert commit_plan(t_b, planned(t_b, BATCHES[1]), set(), query_id="q", batch_id=1, hold=holds[0])
    assert table_state(plain().scan().to_arrow()) == model(BATCHES[0] + BATCHES[1])
