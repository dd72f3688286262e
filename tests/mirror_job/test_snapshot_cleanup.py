"""The query route's snapshot files in the table's store: a snapshot whose read fails leaves nothing in the
table's location (one directory per retry before), on a local disk and on an S3 server; a read that succeeds
writes its files straight into the store with the snapshot's write options."""

from __future__ import annotations

import copy
import socket

import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader
from msgstream_spark.mirror.snapshot.query.rpc import QueryTarget
from msgstream_spark.mirror.store import Store

pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_failed_snapshot_write_removes_its_directory(spark, tmp_path, request, where):
    from msgstream_spark.config.loader import Config
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.spark.snapshot import write_snapshot

    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {  # nobody listens there
        "address": f"127.0.0.1:{closed_port()}", "requestTimeout": 2, "metadataPath": str(tmp_path / "m.json")}}))
    target = QueryTarget(settings, "c", 7)
    schema = table_schema(pa.schema([("pk", pa.int64()), ("v", pa.string())]), "pk")
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        store = open_store(s3.uri("t"), s3.options())
    else:
        (tmp_path / "t").mkdir()
        store = open_store(str(tmp_path / "t"))
    for attempt in range(2):  # a retried snapshot does not pile up directories either
        with pytest.raises(Exception, match="127.0.0.1"):
            write_snapshot(spark, RangeReader(target, "pk", False, schema, 100), [PkRange()],
                           store.join(f"snapshot-100-{attempt}"), 10, progress_interval=60, store=store)
    assert list(store.list(store.join(""))) == []
    if where == "local":
        assert list((tmp_path / "t").iterdir()) == []


@pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")
def test_the_snapshot_files_go_straight_into_an_s3_table(spark, milvus_proxy, s3, tmp_path):
    """Two ranges read from the proxy's model at S by Spark tasks, written into a bucket: the files are the store's
    URIs, their rows the model's, the counts the tasks'; the float vectors uncompressed and without statistics,
    the other columns snappy with statistics (the key's bounds a commit records come from them)."""
    from msgstream_spark.mirror.snapshot.query.reader import plan_ranges
    from msgstream_spark.mirror.snapshot.query.rpc import Querier
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.store.parquet import footer, read_parquet
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.msg.schema import collection_arrow_schema
    from msgstream_spark.spark.snapshot import write_snapshot
    from tests.fixtures.milvus_env import milvus_config
    from tests.milvus_proxy.wal import tso_now
    from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, row

    model = milvus_proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"], collection_schema(),
                                         PARTITIONS)
    with model.lock:
        model.put(row(k) for k in range(400))
    s = tso_now()
    target = QueryTarget(MilvusSettings(milvus_config(milvus_proxy.address, tmp_path)), NAME, CID, floor_ts=s)
    q = Querier(target)
    try:
        ranges = plan_ranges(q, "pk", False, 2)
    finally:
        q.close()
    schema = table_schema(collection_arrow_schema(collection_schema()), "pk")
    store = open_store(s3.uri("t"), s3.options())
    out = store.join(f"snapshot-{s}-x")
    files = write_snapshot(spark, RangeReader(target, "pk", False, schema, s, row_bytes=200), ranges, out, 400,
                           progress_interval=60, store=store)
    assert len(files.files) == len(ranges) == 2 and all(f.startswith(out + "/") for f in files.files)
    assert sorted(m.uri for m in store.list(out)) == files.files  # nothing else: no temporary object left
    assert files.rows == 400 and files.calls >= len(ranges)
    got = pa.concat_tables([read_parquet(store, f) for f in files.files])
    assert sorted(got.column("pk").to_pylist()) == list(range(400))
    meta = footer(store, files.files[0])[1]
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    for i, name in enumerate(names):
        col = meta.row_group(0).column(i)
        if name.startswith("fv."):  # the vector's floats
            assert col.compression == "UNCOMPRESSED" and col.statistics is None, name
        elif name == "pk":
            assert col.compression == "SNAPPY" and col.statistics.has_min_max, name


def test_a_key_read_in_two_partitions_is_one_snapshot_row(spark, tmp_path):
    """Two partitions' reads both hold key 5 (moved between them during the snapshot, or inserted into both):
    the snapshot's files keep one row for it, the one of the larger partition id; the files it returns are those
    that hold the rows now (the rewritten one in place of the old), from its tasks, not from a listing."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.order import snapshot_seq_array
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.spark.snapshot import one_row_per_key

    out = tmp_path / "t" / "snapshot-100-x"
    out.mkdir(parents=True)
    store = open_store(str(tmp_path / "t"))
    written = []
    for part, keys in ((11, [1, 5, 7]), (12, [5, 9])):
        n = len(keys)
        written.append(store.join("snapshot-100-x", f"part-{part}.parquet"))
        pq.write_table(pa.table({"pk": pa.array(keys, pa.int64()), "v": [f"p{part}"] * n,
                                 "_ts": pa.array([100] * n, pa.int64()), "_seq": snapshot_seq_array(100, n),
                                 "_partition": pa.array([part] * n, pa.int64())}), written[-1])
    files, dropped = one_row_per_key(spark, written, "pk", store)
    assert dropped == 1 and written[1] in files and written[0] not in files and len(files) == 2
    assert files == sorted(m.uri for m in store.list(store.join("snapshot-100-x")))
    got = sorted((r["pk"], r["v"], r["_partition"]) for f in files for r in pq.read_table(f).to_pylist())
    assert got == [(1, "p11", 11), (5, "p12", 12), (7, "p11", 11), (9, "p12", 12)]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["snapshot-100-x"]
    assert one_row_per_key(spark, files, "pk", store) == (files, 0)


def test_a_retried_key_pass_task_finds_its_file(tmp_path):
    """A key-pass task rewrites its file without the losing rows; a retry of it (the first attempt's answer lost)
    must still find the file: the task never deletes it (the driver does, once every task has answered)."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.spark.snapshot import _drop_losers

    store = open_store(str(tmp_path / "t"))
    (tmp_path / "t" / "s").mkdir(parents=True)
    path = store.join("s", "part-1.parquet")
    pq.write_table(pa.table({"pk": pa.array([1, 5], pa.int64()), "_partition": pa.array([11, 11], pa.int64())}),
                   path)
    winners = pa.table({"pk": pa.array([5], pa.int64()), "_partition": pa.array([12], pa.int64())})
    first = _drop_losers(path, store, "pk", winners)
    again = _drop_losers(path, store, "pk", winners)  # the retry: the old code had deleted ``path``
    assert first[1] == again[1] == 1 and first[0] != again[0]
    assert pq.read_table(again[0]).column("pk").to_pylist() == [1]


class LateUpload(Store):
    """The driver's view of ``inner`` while a task attempt Spark gave up on finishes its upload late: right after
    the driver's first call once the tasks returned (a listing is answered first, then the file lands), a copy of
    one task's file appears next to it in the snapshot's directory ``out_dir`` (``late``: its URI). The tasks get
    ``inner`` itself: the wrapper pickles as it."""

    def __init__(self, inner: Store, out_dir: str) -> None:
        super().__init__(inner.root, inner.options)
        self.kind, self.inner, self.out_dir, self.late = inner.kind, inner, out_dir, None

    def __reduce__(self):  # unpickled (in a task) as a copy of the plain store
        return copy.copy, (self.inner,)

    def _land(self, answer):
        if self.late is None:
            first = sorted(m.uri for m in self.inner.list(self.out_dir) if m.uri.endswith(".parquet"))[0]
            self.late = first.rsplit("-", 1)[0] + "-late0000.parquet"
            self.inner.put(self.late, self.inner.read(first))
        return answer

    def list(self, prefix):
        return iter(self._land(list(self.inner.list(prefix))))

    def read(self, target):
        return self._land(self.inner.read(target))

    def get(self, target):
        return self._land(self.inner.get(target))

    def read_range(self, target, offset, length):
        return self._land(self.inner.read_range(target, offset, length))

    def head(self, target):
        return self._land(self.inner.head(target))

    def open_input(self, target):
        return self._land(self.inner.open_input(target))

    def put(self, target, data):
        return self.inner.put(target, data)

    def put_if_absent(self, target, data):
        return self.inner.put_if_absent(target, data)

    def put_if_match(self, target, data, etag):
        return self.inner.put_if_match(target, data, etag)

    def delete(self, target):
        return self.inner.delete(target)

    def open_output(self, target):
        return self.inner.open_output(target)


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")
def test_the_snapshot_commits_the_files_its_tasks_returned(spark, milvus_proxy, tmp_path, request, where):
    """#45 item 2: an attempt Spark gave up on finishes its upload after the tasks returned (after the driver's
    tidy-up listing): its copy of a range is not committed next to the successful attempt's (the table's rows are
    the collection's, each once; the listing was committed before), it stays in the snapshot's directory as an
    orphan that ``mirror orphans`` lists as a killed or failed writer's."""
    from msgstream_spark.mirror.maintenance import classify_orphans, orphans
    from msgstream_spark.mirror.snapshot.query.reader import plan_ranges
    from msgstream_spark.mirror.snapshot.query.rpc import Querier
    from msgstream_spark.mirror.store import open_store
    from msgstream_spark.mirror.table import open_table
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.msg.schema import collection_arrow_schema
    from msgstream_spark.spark.snapshot import write_snapshot
    from tests.fixtures.milvus_env import milvus_config
    from tests.milvus_proxy.wal import tso_now
    from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, row

    model = milvus_proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"], collection_schema(),
                                         PARTITIONS)
    with model.lock:
        model.put(row(k) for k in range(300))
    s = tso_now()
    target = QueryTarget(MilvusSettings(milvus_config(milvus_proxy.address, tmp_path)), NAME, CID, floor_ts=s)
    q = Querier(target)
    try:
        ranges = plan_ranges(q, "pk", False, 2)
    finally:
        q.close()
    options = request.getfixturevalue("s3").options() if where == "s3" else None
    location = request.getfixturevalue("s3").uri("t") if where == "s3" else str(tmp_path / "t")
    fields = collection_arrow_schema(collection_schema())
    table = open_table("delta", location, collection=NAME, pk="pk", create=False, storage_options=options)
    out = table.store.join(f"snapshot-{s}-x")
    store = LateUpload(open_store(location, options), out)
    files = write_snapshot(spark, RangeReader(target, "pk", False, table_schema(fields, "pk"), s, row_bytes=200),
                           ranges, out, 300, progress_interval=60, store=store)
    assert store.late is not None and store.inner.head(store.late) is not None  # the late file landed
    assert len(files.files) == len(ranges) == 2 and store.late not in files.files and files.rows == 300
    table.add_files(files.files, properties={"msgstream.snapshot_ts": str(s)})
    got = open_table("delta", location, collection=NAME, pk="pk", storage_options=options, create=False).to_arrow()
    assert got.num_rows == 300 and sorted(got.column("pk").to_pylist()) == list(range(300))  # each row once
    assert orphans(table) == [store.late]
    assert classify_orphans(table, [store.late]).left_by_writers == [store.late]
