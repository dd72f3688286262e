"""``output=collections`` (source.multi) without Spark, and the many-collection job's selection and naming rule."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError, OptionError
from msgstream_spark.mirror.many import ManyState, parse_selection, table_identifier, table_location
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.source.arrow import read_table
from msgstream_spark.source.multi import unpack
from msgstream_spark.source.rows import rows_arrow_schema
from tests.mirror_job.many_log import schema, two_collections


def test_one_read_gives_each_collections_rows_and_ddl(local_env):
    chans, drop_ts = two_collections(local_env, "multi")
    t = read_table(local_env.config.to_dict(), chans, output="collections")
    ddl = [r for r in t.drop_columns(["payload"]).to_pylist() if r["kind"] != "rows"]
    # CreateCollection (no database, no name: the schema's) and DropCollection, once per pchannel
    assert sorted({(r["kind"], r["_collection"], r["name"], r["db"]) for r in ddl}) == [
        ("create", 11, "a", ""), ("create", 12, "b", ""), ("drop", 12, "b", "")]
    assert {r["_ts"] for r in ddl if r["kind"] == "drop"} == {drop_ts}
    for cid, name in ((11, "a"), (12, "b")):
        pieces = t.filter(pa.compute.and_(pa.compute.equal(t.column("kind"), "rows"),
                                          pa.compute.equal(t.column("_collection"), cid)))
        assert set(pieces.column("db").to_pylist()) == {"db1" if cid == 11 else "db2"}
        rows = unpack(pieces.column("payload").to_pylist(), rows_arrow_schema(collection_arrow_schema(schema(name))),
                      "pk")
        got = sorted((r["op"], r["pk"], r["s"]) for r in rows.to_pylist())
        want = {11: [("delete", 1, None), ("delete", 4, None), *[("insert", k, f"a-{k}") for k in range(6)]],
                12: [("delete", 2, None), ("insert", 0, "b-0"), ("insert", 1, "b-1"), ("insert", 2, "b-2"),
                     ("insert", 2, "b-1002")]}[cid]
        assert got == sorted(want)
        assert set(rows.column("_collection").to_pylist()) == {cid} and rows.column("_seq").null_count == 0
    # the upsert's insert and delete share a timestamp: the insert's _seq is the higher one (it wins)
    b = unpack(t.filter(pa.compute.equal(t.column("_collection"), 12)).filter(
        pa.compute.equal(pa.compute.field("kind"), "rows")).column("payload").to_pylist(),
        rows_arrow_schema(collection_arrow_schema(schema("b"))), "pk").to_pylist()
    upsert = [r for r in b if r["pk"] == 2 and r["_ts"] == max(x["_ts"] for x in b)]
    assert max(upsert, key=lambda r: r["_seq"])["op"] == "insert"


def test_collections_output_refuses_one_collection_options(local_env):
    with pytest.raises(OptionError, match="output=collections"):
        read_table(local_env.config.to_dict(), [local_env.new_channel("x")], output="collections", collection="a")


def test_selection_and_naming_rule(tmp_path):
    assert parse_selection("shop", None, None).matches("shop", "x") and not parse_selection("shop", None,
                                                                                             None).matches("crm", "x")
    sel = parse_selection(None, "a, crm.b", None)
    assert sel.matches("any", "a") and sel.matches("crm", "b") and not sel.matches("shop", "b")
    rx = parse_selection(None, None, r"shop\..*")
    assert rx.matches("shop", "t1") and not rx.matches("shopx", "t1")
    with pytest.raises(MirrorError, match="--include"):
        parse_selection(None, None, "(")
    assert table_location("s3://b/lake/", "db", "c", 7, None) == "s3://b/lake/db/c"
    assert table_location("lake", "db", "c", 7, 7) == "lake/db/c"
    assert table_location("lake", "db", "c", 9, 7) == "lake/db/c__9"  # a re-created name: the id decides
    with pytest.raises(MirrorError, match="path part"):
        table_location("lake", "..", "c", 9, None)
    assert table_identifier("mirror", "db", "c", 7, None) == "mirror.db__c"  # --catalog NAME --namespace NS
    assert table_identifier("a.b", "db", "c", 9, 7) == "a.b.db__c__9"
    with pytest.raises(MirrorError, match="identifier"):
        table_identifier("mirror", "db", "c.d", 9, None)
    with pytest.raises(MirrorError, match="--namespace"):
        table_identifier("a..b", "db", "c", 9, None)
    st = ManyState.load(str(tmp_path))
    st.created(5, "c", "", b"\x01", 100)
    st.seen(5, "c", "")  # the inserts name no database: Milvus's default
    st.save()
    again = ManyState.load(str(tmp_path))
    assert again.known[5].db == "default" and again.schema_bytes(5) == b"\x01"


@pytest.mark.parametrize(("argv", "says"), [
    (["--database", "d"], "pass --table-root"),
    (["--database", "d", "--table-root", "r", "--table", "t"], "--table and --collection name one collection"),
    (["--include", "x", "--table-root", "r"], "--table-format, one of delta, iceberg, lance"),
    (["--database", "d", "--table-root", "r", "--table-format", "delta", "--snapshot-concurrency", "0"],
     "--snapshot-concurrency 0: must be 1 or more"),
    (["--database", "d", "--namespace", "ns", "--table-concurrency", "-1"], "--table-concurrency -1: must be 1"),
    (["--collections", "a", "--table-root", "r", "--table-format", "delta", "--snapshot", "when_needed"],
     r"when_needed is the one-collection job's .* one checkpoint.* --snapshot initial"),
    (["--collection", "c", "--table", "t", "--table-root", "r", "--table-format", "delta"], "--table-root is for"),
    (["--database", "d", "--namespace", "ns", "--checkpoint", "c"], "pass --catalog NAME"),
    (["--database", "d", "--namespace", "ns", "--catalog", "lake"], "pass --checkpoint DIR"),
    (["--database", "d", "--namespace", "ns", "--catalog", "lake", "--checkpoint", "c", "--table-root", "r"],
     "not with --table-root"),
    (["--database", "d", "--namespace", "ns", "--catalog", "lake", "--checkpoint", "c", "--table-format", "delta"],
     "keep Iceberg tables"),
])
def test_mirror_run_refuses_a_mix_of_one_and_many_collection_flags(argv, says):
    from msgstream_spark.cli.vocab import UsageError
    from msgstream_spark.jobs import mirror

    with pytest.raises(UsageError, match=says):  # before Spark or any backend starts
        mirror.run(mirror.build_parser().parse_args(argv))


def test_a_26_wal_read_gives_each_ddl_copy_with_its_vchannel(local_env):
    """2.6.6+ broadcasts (tests/mirror_job/wal_log.py): CreateCollection naming collection and database, a rename,
    a DropPartition and a TruncateCollection, each as a copy on the control vchannel and one per vchannel, each
    copy a row with its vchannel and time; the truncate's rows carry the shard count its broadcast header names."""
    from tests.mirror_job.wal_log import NEW, WalLog

    chans = [local_env.new_channel("multi26") for _ in range(2)]
    with local_env.client() as c:
        log = WalLog(c, chans)
        log.create("db1", "a", 41, NEW)
        log.insert(41, range(4))
        log.rename(41, name="a2", db="db2")
        log.drop_partition(41, 411)
        log.truncate(41)
        log.tick()
        log.close()
    t = read_table(local_env.config.to_dict(), chans, output="collections")
    ddl = [r for r in t.drop_columns(["payload"]).to_pylist() if r["kind"] != "rows"]
    vchannels = {f"{chans[0]}_vcchan", f"{chans[0]}_41v0", f"{chans[1]}_41v1"}
    for kind, names in (("create", ("a", "db1")), ("rename", ("a2", "db2")), ("drop_partition", ("", "")),
                        ("truncate", ("", ""))):
        rows = [r for r in ddl if r["kind"] == kind]
        assert {r["_shard"] for r in rows} == vchannels, kind
        assert {(r["_collection"], r["name"], r["db"]) for r in rows} == {(41, *names)}, kind
        assert len({r["_ts"] for r in rows}) == 3, kind  # each copy at its own time
    assert {r["_partition"] for r in ddl if r["kind"] == "drop_partition"} == {411}
    assert {r["rows"] for r in ddl if r["kind"] == "truncate"} == {2}
