"""A snapshot whose read fails leaves no Parquet directory in the table's location (one per retry before)."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader
from msgstream_spark.mirror.snapshot.query.rpc import QueryTarget

pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_snapshot_write_removes_its_directory(spark, tmp_path):
    from msgstream_spark.config.loader import Config
    from msgstream_spark.mq.milvus.settings import MilvusSettings
    from msgstream_spark.spark.snapshot import write_snapshot

    settings = MilvusSettings(Config.from_dict({"mq": {"type": "milvus"}, "milvus": {  # nobody listens there
        "address": f"127.0.0.1:{closed_port()}", "requestTimeout": 2, "metadataPath": str(tmp_path / "m.json")}}))
    target = QueryTarget(settings, "c", 7)
    schema = table_schema(pa.schema([("pk", pa.int64()), ("v", pa.string())]), "pk")
    table = tmp_path / "t"
    table.mkdir()
    for attempt in range(2):  # a retried snapshot does not pile up directories either
        with pytest.raises(Exception, match="127.0.0.1"):
            write_snapshot(spark, RangeReader(target, "pk", False, schema, 100), [PkRange()],
                           str(table / f"snapshot-100-{attempt}"), 10, progress_interval=60)
    assert list(table.iterdir()) == []


def test_a_key_read_in_two_partitions_is_one_snapshot_row(spark, tmp_path):
    """Two partitions' reads both hold key 5 (moved between them during the snapshot, or inserted into both):
    the snapshot's files keep one row for it, the one of the larger partition id."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.order import snapshot_seq_array
    from msgstream_spark.spark.snapshot import one_row_per_key

    out = tmp_path / "t" / "snapshot-100-x"
    out.mkdir(parents=True)
    for part, keys in ((11, [1, 5, 7]), (12, [5, 9])):
        n = len(keys)
        pq.write_table(pa.table({"pk": pa.array(keys, pa.int64()), "v": [f"p{part}"] * n,
                                 "_ts": pa.array([100] * n, pa.int64()), "_seq": snapshot_seq_array(100, n),
                                 "_partition": pa.array([part] * n, pa.int64())}), out / f"part-{part}.parquet")
    assert one_row_per_key(spark, str(out), "pk") == 1
    got = sorted((r["pk"], r["v"], r["_partition"]) for r in pq.read_table(out).to_pylist())
    assert got == [(1, "p11", 11), (5, "p12", 12), (7, "p11", 11), (9, "p12", 12)]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["snapshot-100-x"]
    assert one_row_per_key(spark, str(out), "pk") == 0
