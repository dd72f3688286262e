"""A snapshot whose read fails leaves no Parquet directory in the table's location (one per retry before)."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot import CollectionInfo, MilvusTarget, PkRange, RangeReader

pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_snapshot_write_removes_its_directory(spark, tmp_path):
    from msgstream_spark.spark.snapshot import write_snapshot

    target = MilvusTarget(f"127.0.0.1:{closed_port()}", "c", timeout=2.0)  # nobody listens: every task fails
    info = CollectionInfo(7, "pk", False, ("pk", "v"), False, 10)
    schema = table_schema(pa.schema([("pk", pa.int64()), ("v", pa.string())]), "pk")
    table = tmp_path / "t"
    table.mkdir()
    for attempt in range(2):  # a retried snapshot does not pile up directories either
        with pytest.raises(Exception, match="cannot connect to Milvus at 127.0.0.1"):
            write_snapshot(spark, RangeReader(target, info, schema, 100), [PkRange()],
                           str(table / f"snapshot-100-{attempt}"), 10, progress_interval=60)
    assert list(table.iterdir()) == []
