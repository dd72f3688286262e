"""``read_arrow`` (the library's read without Spark) gives the rows of ``spark.read.format("msgstream")``
with the same options, on every backend. Data: the independent 2.6 test producer (writable backends)
and the suite's 2.5 publisher (every backend, the milvus one through the store its proxy serves)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from msgstream_spark.source import read_arrow
from tests.spark import wal26_data as W
from tests.spark.helpers import Publisher, spark_options

pytestmark = pytest.mark.slow  # Spark end to end


def _plain(v):
    if isinstance(v, dt.datetime):
        return int(v.timestamp() * 1_000_000)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v


def _rows(table: pa.Table) -> list[tuple]:
    out = [tuple((k, _plain(v)) for k, v in r.items()) for r in table.to_pylist()]
    return sorted(out, key=repr)


def _both(spark, env, channels: list[str], **opts) -> tuple[pa.Table, pa.Table]:
    options = {**spark_options(env), **{k: str(v) for k, v in opts.items()}}
    via_spark = spark.read.format("msgstream").options(**options).option("channels", ",".join(channels)).load()
    batches = list(read_arrow(env.config, channels, **opts))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    return via_spark.toArrow(), pa.Table.from_batches(batches)


@pytest.fixture
def channels(read_backend):
    """A 2.5 channel on every backend; on the writable ones also a channel of 2.6 messages."""
    env = read_backend
    if env.extras.get("external"):
        pytest.skip("an external Milvus proxy: the suite cannot write entries into its WAL")
    writer = env.extras.get("writer")
    client = writer.client if writer is not None else env.client()
    old = env.new_channel("dml")
    pub = Publisher(client, [old])
    try:
        pub.rounds(2, rows=5)
        pub.delete(old, [0, 3])
        pub.tick()
    finally:
        pub.close()
        if writer is None:
            client.close()
    if env.name == "milvus":
        return [old], None
    new = env.new_channel("wal")
    W.write_mixed(env, new)
    return [old], [new]


@pytest.mark.parametrize("output", ["rows", "messages"])
def test_read_arrow_equals_the_spark_read(spark, read_backend, channels, output):
    old, new = channels
    for chans in filter(None, (old, new)):
        spark_t, lib_t = _both(spark, read_backend, chans, output=output)
        assert lib_t.column_names == spark_t.column_names
        assert lib_t.num_rows == spark_t.num_rows > 0
        assert _rows(lib_t) == _rows(spark_t)
    if new and output == "rows":  # options reach both the same way
        spark_t, lib_t = _both(spark, read_backend, new, messageTypes="insert", endingTimestamp=W.TT + 4)
        assert _rows(lib_t) == _rows(spark_t)
        assert sorted(lib_t.column("pk").to_pylist()) == [1, 2, 3, 4]


def test_packed_and_split_spark_reads_give_the_library_rows(spark, local_env):
    """Through Spark: 5 small channels share 2 tasks (RangesPartition), a 2.6 channel split at ticks;
    the rows equal the unsplit library read's."""
    from tests.source.test_split import _25_only, _long_26

    small = [local_env.new_channel("pk") for _ in range(5)]
    for ch in small:
        _25_only(local_env, ch)
    spark_t, lib_t = _both(spark, local_env, small)
    assert spark_t.num_rows == 5 * 24 and _rows(spark_t) == _rows(lib_t)
    long = local_env.new_channel("long")
    _long_26(local_env, long)
    spark_t, _ = _both(spark, local_env, [long], maxRecordsPerPartition=3)
    whole = pa.Table.from_batches(list(read_arrow(local_env.config, [long])))
    assert spark_t.num_rows == whole.num_rows > 10 and _rows(spark_t) == _rows(whole)
