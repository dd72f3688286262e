"""``mirror run --database`` against the real Milvus 2.3.5 (issue #44's "Done when"): collections come and go.

Three collections in two databases (``mm1.a``, ``mm1.b``, ``mm2.c``); a job mirroring database ``mm1`` is started
(its first run snapshots ``a`` and ``b`` through ``query``); then, one job run from the same checkpoint per step:
a fourth collection ``mm1.d`` is created, ``b`` is dropped, the name ``b`` is created again (a new id: the table
``b__<id>``), with inserts, upserts and deletes throughout. After each step every table equals ``query()`` of its
collection row for row; the dropped one keeps its last state and carries the drop's time; ``mm2.c`` (another
database) gets no table. Also: a DropPartition takes the partition's rows out of the table.
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from msgstream_spark.msg.types import MsgType
from tests.milvus_real.stack import ALIAS, pchannels
from tests.milvus_real.test_milvus_oracle import await_ticks

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

DIM = 2


@pytest.fixture
def cfg(milvus_stack, tmp_path) -> str:
    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values.update({"mq.type": milvus_stack.mq, "milvus.address": milvus_stack.uri.removeprefix("http://")})
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.fixture
def dbs(milvus_stack, pymilvus_orm):
    """Aliases connected to databases ``mm1`` and ``mm2`` (made here, their collections dropped at the end)."""
    from pymilvus import connections, db, utility

    warnings.filterwarnings("ignore", message=".*ORM-style PyMilvus API.*")
    out = {}
    for name in ("mm1", "mm2"):
        if name not in db.list_database(using=pymilvus_orm):
            db.create_database(name, using=pymilvus_orm)
        connections.connect(f"{ALIAS}-{name}", uri=milvus_stack.uri, db_name=name, timeout=30)
        out[name] = f"{ALIAS}-{name}"
    yield out
    for alias in out.values():
        for n in utility.list_collections(using=alias):
            utility.drop_collection(n, using=alias)
        connections.disconnect(alias)


def chans_of(dbs: dict, col) -> list[str]:
    """The physical channels of a collection handle connected through one of ``dbs``' aliases."""
    return pchannels(col._using, col.name, next(db for db, alias in dbs.items() if alias == col._using))


def _schema():
    from pymilvus import CollectionSchema, DataType, FieldSchema

    return CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                             FieldSchema("s", DataType.VARCHAR, max_length=32),
                             FieldSchema("fv", DataType.FLOAT_VECTOR, dim=DIM)])


def _rows(keys, gen: int = 0) -> list[dict]:
    return [{"pk": k, "s": f"g{gen}-{k}", "fv": [float(k), float(gen)]} for k in keys]


def create(alias: str, name: str, load: bool = True):
    """A collection of one shard; indexed and loaded (``query()`` reads it) unless ``load`` is false (one only
    written to: a loaded collection costs the server CPU while it lives)."""
    from pymilvus import Collection

    col = Collection(name, _schema(), using=alias, shards_num=1)
    if load:
        col.create_index("fv", {"index_type": "FLAT", "metric_type": "L2", "params": {}}, sync=False)
        col.load()
    return col


def queried(col) -> dict[int, tuple]:
    got = col.query("pk >= 0", output_fields=["pk", "s", "fv"], consistency_level="Strong", limit=16384)
    return {int(r["pk"]): (r["s"], [float(x) for x in r["fv"]]) for r in got}


def table_rows(where) -> dict[int, tuple]:
    from msgstream_spark.mirror.table import open_table

    t = open_table("delta", str(where), collection=where.name.split("__")[0], pk="pk", create=False).to_arrow()
    out = {}
    for r in t.select(["pk", "s", "fv"]).to_pylist():
        assert r["pk"] not in out, f"pk {r['pk']} twice in {where}"
        out[r["pk"]] = (r["s"], [float(x) for x in r["fv"]])
    return out


def await_drop(stack, after: dict, timeout: float = 60.0, what: int = MsgType.DropCollection) -> None:
    """Wait (bounded) until each channel holds a DropCollection (``what``) after the message id given (2.3-2.5
    write it from an asynchronous step after the drop's answer)."""
    import time

    from msgstream_spark.msg import codec

    deadline = time.monotonic() + timeout
    with stack.env.client() as c:
        for ch, start in after.items():
            r = c.reader(ch)
            try:
                r.seek(start, inclusive=False)
                while True:
                    left = deadline - time.monotonic()
                    assert left > 0, f"no message of type {what} on {ch} within {timeout}s"
                    got = r.receive_batch(64, min(left, 5.0))
                    if any(codec.peek_msg_type(m.payload, m.properties) == what for m in got):
                        break
            finally:
                r.unsubscribe()


def test_a_database_job_follows_collections_created_dropped_and_created_again(spark, milvus_stack, dbs, cfg,
                                                                              tmp_path):
    from pymilvus import utility

    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.formats import registry
    from msgstream_spark.mirror.many import PROP_DROPPED_TS

    root = tmp_path / "lake"
    cols = {"a": create(dbs["mm1"], "a"), "b": create(dbs["mm1"], "b"), "c": create(dbs["mm2"], "c", load=False)}
    last_ts = 0
    b_dropped = False

    def write(kind: str, name: str, keys, gen: int = 0) -> None:
        nonlocal last_ts
        col = cols[name]
        if kind == "delete":
            r = col.delete(f"pk in {list(keys)}")
        else:
            r = getattr(col, kind)(_rows(keys, gen))
        last_ts = max(last_ts, int(r.timestamp))

    def step(tables: dict[str, str], *more: str) -> dict:
        live = [c for n, c in cols.items() if not (n == "b" and b_dropped)]
        await_ticks(milvus_stack, last_ts, sorted({ch for c in live for ch in chans_of(dbs, c)}))
        out = mirror.run(mirror.build_parser().parse_args([
            "--config", cfg, "--database", "mm1", "--table-root", str(root), "--table-format", "delta",
            "--progress-interval", "1", *more]), spark)
        known = (root.parent / "lake_checkpoint" / "collections.json").read_text()
        for name, table in tables.items():
            assert (root / "mm1" / table).exists(), f"no table {table} of mm1.{name}: {out['tables']}, {known}"
            assert table_rows(root / "mm1" / table) == queried(cols[name]), f"table {table} of mm1.{name}"
        assert not (root / "mm2").exists()  # mm2.c is not selected
        return out

    write("insert", "a", range(0, 20))
    write("insert", "b", range(0, 10))
    write("insert", "c", range(0, 5))
    first = step({"a": "a", "b": "b"})
    assert sorted(first["tables"]) == ["mm1.a", "mm1.b"], first

    # a fourth collection created between two runs: from its CreateCollection on the stream (2.3.5 writes no
    # database there, and pymilvus passes it in a header, so the inserts name none either: the job asks Milvus)
    cols["d"] = create(dbs["mm1"], "d")
    write("insert", "d", range(100, 110))
    write("upsert", "a", [1, 2, 30], gen=1)
    write("delete", "b", [0, 1])
    # later runs --snapshot never: a collection made between two runs comes from its CreateCollection on the
    # stream, as while a job runs (with initial a restart would snapshot the ones collections.json does not know)
    never = ("--snapshot", "never")
    step({"a": "a", "b": "b", "d": "d"}, *never)

    # b dropped: its table keeps its last state and is marked
    b_last = queried(cols["b"])
    b_chans = pchannels(dbs["mm1"], "b", "mm1")
    with milvus_stack.env.client() as c:
        before = {ch: c.latest_message_id(ch) for ch in b_chans}
    utility.drop_collection("b", using=dbs["mm1"])
    b_dropped = True
    await_drop(milvus_stack, before)
    write("delete", "d", [100])
    write("insert", "a", [40])
    dropped_out = step({"a": "a", "d": "d"}, *never)
    assert table_rows(root / "mm1" / "b") == b_last
    props = registry.stored_properties("delta", str(root / "mm1" / "b"))
    assert props.get(PROP_DROPPED_TS) == str(dropped_out["tables"]["mm1.b"]["dropped_ts"]), props

    # the name b created again: a new id, a new table
    cols["b"] = create(dbs["mm1"], "b")
    b_dropped = False
    write("insert", "b", range(0, 3), gen=2)
    write("upsert", "d", [101], gen=3)
    from pymilvus import Collection

    new_id = int(Collection("b", using=dbs["mm1"]).describe()["collection_id"])
    out = step({"a": "a", "d": "d", "b": f"b__{new_id}"}, *never)
    assert out["tables"][f"mm1.b__{new_id}"]["id"] == new_id, out["tables"]  # the summary names it as its table
    assert table_rows(root / "mm1" / "b") == b_last  # the old table untouched


def test_a_dropped_partition_s_rows_leave_the_table(spark, milvus_stack, dbs, cfg, tmp_path):
    """Milvus 2.3.5's DropPartition (its GC step writes it to the collection's pchannels): the table loses the
    partition's rows, those of the snapshot and those the stream brought, and equals ``query()`` after it."""
    from pymilvus import Partition

    root = tmp_path / "lake"
    col = create(dbs["mm1"], "p")
    col.create_partition("pa")
    col.insert(_rows(range(0, 5)))
    last = int(col.insert(_rows(range(10, 15)), partition_name="pa").timestamp)
    chans = pchannels(dbs["mm1"], "p", "mm1")
    argv = ["--config", cfg, "--database", "mm1", "--table-root", str(root), "--table-format", "delta",
            "--progress-interval", "1"]

    def run(*more: str) -> None:
        from msgstream_spark.jobs import mirror

        await_ticks(milvus_stack, last, chans)
        mirror.run(mirror.build_parser().parse_args([*argv, *more]), spark)
        assert table_rows(root / "mm1" / "p") == queried(col)

    run()
    col.insert(_rows(range(15, 18)), partition_name="pa")  # through the stream
    with milvus_stack.env.client() as c:
        before = {ch: c.latest_message_id(ch) for ch in chans}
    Partition(col, "pa").release()
    col.drop_partition("pa")
    await_drop(milvus_stack, before, what=MsgType.DropPartition)
    last = int(col.insert(_rows([5, 6])).timestamp)
    run("--snapshot", "never")
    assert sorted(queried(col)) == [0, 1, 2, 3, 4, 5, 6]


def test_the_one_collection_job_takes_a_dropped_partition_s_rows_out(spark, milvus_stack, pymilvus_orm, cfg,
                                                                      tmp_path):
    """``mirror run --collection``: Milvus 2.3.5's DropPartition takes the partition's rows out of the table,
    those of the snapshot (their ``_partition`` as Milvus answered) and those the stream brought; the table
    equals ``query()`` after it."""
    from pymilvus import Partition, utility

    from msgstream_spark.jobs import mirror

    col = create(pymilvus_orm, "onep")
    table = tmp_path / "onep"
    try:
        col.create_partition("pa")
        col.insert(_rows(range(0, 5)))
        last = int(col.insert(_rows(range(10, 15)), partition_name="pa").timestamp)
        chans = pchannels(pymilvus_orm, "onep")
        argv = ["--config", cfg, "--collection", "onep", "--table", str(table), "--table-format", "delta",
                "--channels", ",".join(chans), "--progress-interval", "1"]

        def run() -> dict:
            await_ticks(milvus_stack, last, chans)
            out = mirror.run(mirror.build_parser().parse_args(argv), spark)
            assert table_rows(table) == queried(col)
            return out

        assert run()["snapshot"]["mode"] == "initial"
        col.insert(_rows(range(15, 18)), partition_name="pa")  # through the stream
        with milvus_stack.env.client() as c:
            before = {ch: c.latest_message_id(ch) for ch in chans}
        Partition(col, "pa").release()
        col.drop_partition("pa")
        await_drop(milvus_stack, before, what=MsgType.DropPartition)
        last = int(col.insert(_rows([5, 6])).timestamp)
        assert run()["removals"] >= 1
        assert sorted(queried(col)) == [0, 1, 2, 3, 4, 5, 6]
    finally:
        utility.drop_collection("onep", using=pymilvus_orm)


def test_a_database_job_snapshots_its_collections_from_storage(spark, milvus_stack, dbs, tmp_path):
    """``--database --snapshot-source storage``: two collections of two shards each, never loaded (the storage
    route reads Milvus's binlogs and etcd, no query), several flushed segments, deletes and upserts in delete logs
    and unflushed; the first run snapshots both from storage, the second streams what came after. Each table
    equals ``query()`` of its collection after each run (the collections loaded for the check only)."""
    from pymilvus import Collection

    from msgstream_spark.jobs import mirror
    from tests.milvus_real.test_mirror_storage import storage_config

    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values.update({"mq.type": milvus_stack.mq, "milvus.address": milvus_stack.uri.removeprefix("http://")})
    cfg = tmp_path / "storage.yaml"
    cfg.write_text(yaml.safe_dump(storage_config(milvus_stack, values)))
    root = tmp_path / "lake"
    cols = {}
    for name in ("sa", "sb"):
        cols[name] = Collection(name, _schema(), using=dbs["mm2"], shards_num=2)
        cols[name].create_index("fv", {"index_type": "FLAT", "metric_type": "L2", "params": {}})
    last = 0

    def write(kind: str, name: str, keys, gen: int = 0) -> None:
        nonlocal last
        col = cols[name]
        r = col.delete(f"pk in {list(keys)}") if kind == "delete" else getattr(col, kind)(_rows(keys, gen))
        last = max(last, int(r.timestamp))

    def run() -> dict:
        await_ticks(milvus_stack, last, sorted({ch for c in cols.values() for ch in chans_of(dbs, c)}))
        return mirror.run(mirror.build_parser().parse_args([
            "--config", str(cfg), "--database", "mm2", "--table-root", str(root), "--table-format", "delta",
            "--snapshot-source", "storage", "--progress-interval", "1"]), spark)

    def check() -> None:
        for name, col in cols.items():
            col.load()
            try:
                assert table_rows(root / "mm2" / name) == queried(col), f"table of mm2.{name}"
            finally:
                col.release()

    write("insert", "sa", range(0, 200))
    write("insert", "sb", range(0, 50))
    for col in cols.values():
        col.flush()
    write("insert", "sa", range(200, 300))
    write("delete", "sa", range(0, 20))
    write("upsert", "sa", range(30, 40), gen=1)
    write("upsert", "sb", range(0, 5), gen=1)
    cols["sa"].flush()  # deletes and upserts in delete logs
    write("delete", "sb", [10, 11])
    write("upsert", "sa", range(250, 260), gen=2)  # unflushed: the job's flush writes them
    first = run()
    assert sorted(first["tables"]) == ["mm2.sa", "mm2.sb"], first
    check()

    write("upsert", "sa", [1, 2, 35, 255], gen=3)
    write("delete", "sb", [0, 20])
    write("insert", "sb", range(100, 110))
    second = run()
    assert sum(t["changes"] for t in second["tables"].values()) > 0, second
    check()
