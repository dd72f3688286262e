"""What the real Milvus 2.3.5 does with a primary key repeated inside one request (the mirror's change order
depends on it, docs/spark-source.md "Change order").

One collection on one shard (so every message of a request lands on one channel, in order):
(a) an insert whose batch repeats a pk; (b) an upsert whose batch repeats a pk; (c) an upsert of one pk.
``query`` (Strong) is the truth for what Milvus keeps; the Kafka channel shows what it wrote.
"""

from __future__ import annotations

import time

import pytest

from msgstream_spark.mq.base import SubscriptionInitialPosition
from msgstream_spark.msg import codec
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg
from tests.milvus_real.test_milvus_oracle import pchannels
from tests.milvus_real.workload import flush, load

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]


def _schema():
    from pymilvus import CollectionSchema, DataType, FieldSchema

    return CollectionSchema([FieldSchema("pk", DataType.INT64, is_primary=True),
                             FieldSchema("v", DataType.INT64),
                             FieldSchema("fv", DataType.FLOAT_VECTOR, dim=2)])


def _rows(pairs):
    return [{"pk": pk, "v": v, "fv": [float(v), 0.0]} for pk, v in pairs]


def _channel_changes(stack, collection_id: int, chans: list[str], until_ts: int) -> list[tuple]:
    """(op, ts, pk, v) of every insert/delete row of the collection, in channel order then row order, read
    up to a TimeTick beyond ``until_ts`` on each of the collection's channels (Milvus ticks the channels of
    live collections: after the tick no earlier data follows; a channel whose collections were all dropped
    by earlier tests gets no more ticks, so only the collection's own channels are read)."""
    out = []
    with stack.env.client() as c:
        for ch in chans:
            sub = c.subscribe(ch, "repeated-pk-probe", SubscriptionInitialPosition.EARLIEST)
            try:
                for msg in _until_tick(sub, ch, until_ts):
                    if not isinstance(msg, (InsertMsg, DeleteMsg)) or msg.collection_id != collection_id:
                        continue
                    out.extend(_msg_changes(msg))
            finally:
                sub.unsubscribe()
    return out


def _until_tick(sub, channel: str, until_ts: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in sub.receive_batch(500, 1.0):
            msg = codec.unmarshal(m.payload, m.properties, channel=channel)
            if isinstance(msg, TimeTickMsg) and msg.end_ts > until_ts:
                return
            yield msg
    raise AssertionError(f"no TimeTick beyond {until_ts} on {channel} within {timeout}s")


def _msg_changes(msg) -> list[tuple]:
    ts = [int(t) for t in msg.timestamps]
    if isinstance(msg, InsertMsg):
        cols = {fd.field_name: fd for fd in msg.proto.fields_data}
        pks = list(cols["pk"].scalars.long_data.data)
        vs = list(cols["v"].scalars.long_data.data)
        return [("insert", ts[i], pks[i], vs[i]) for i in range(len(pks))]
    if isinstance(msg, DeleteMsg):
        return [("delete", ts[i], int(pk), None) for i, pk in enumerate(msg.primary_keys)]
    return []


def _query(col) -> list[tuple[int, int]]:
    got = col.query("pk >= 0", output_fields=["pk", "v"], consistency_level="Strong", limit=100)
    return sorted((int(r["pk"]), int(r["v"])) for r in got)


@pytest.fixture(scope="module")
def repeated(milvus_stack, pymilvus_orm):
    """The writes on a loaded collection: ``query`` answers from growing segments, then (after flush,
    release, load) from sealed ones."""
    from pymilvus import Collection

    col = Collection("repeated_pk", _schema(), using=pymilvus_orm, shards_num=1)
    col.create_index("fv", {"index_type": "FLAT", "metric_type": "L2", "params": {}}, sync=False)
    load(col)
    results = {
        "insert": col.insert(_rows([(1, 10), (2, 20), (1, 11), (1, 12)])),
        "upsert_repeated": col.upsert(_rows([(3, 30), (4, 40), (3, 31)])),
        "upsert_one": col.upsert(_rows([(2, 21)])),
    }
    growing = _query(col)
    flush(col)
    col.release()
    load(col)
    sealed = _query(col)
    last = max(int(r.timestamp) for r in results.values())
    chans = pchannels(pymilvus_orm, "repeated_pk")
    changes = _channel_changes(milvus_stack, col.describe()["collection_id"], chans, last)
    yield results, growing, sealed, changes
    col.drop()


def test_a_pk_repeated_in_one_insert_query_returns_the_first_row(repeated):
    """(a) Every row stays in the WAL message, in request order, all with the request's one timestamp;
    query (growing and sealed segments alike) returns the first row of the repeated pk."""
    results, growing, sealed, changes = repeated
    ts = int(results["insert"].timestamp)
    assert results["insert"].insert_count == 4
    assert [c for c in changes if c[1] == ts] == [("insert", ts, 1, 10), ("insert", ts, 2, 20),
                                                  ("insert", ts, 1, 11), ("insert", ts, 1, 12)]
    assert (1, 10) in growing and (1, 10) in sealed
    assert [r for r in sealed if r[0] == 1] == [(1, 10)] == [r for r in growing if r[0] == 1]


def test_an_upsert_batch_with_a_repeated_pk_keeps_the_first_row(repeated):
    """(b) Milvus 2.3.5 accepts it: one Insert message with every row (request order), then one Delete
    message with every pk (repeated too), one timestamp; query returns the first row of the pk."""
    results, growing, sealed, changes = repeated
    ts = int(results["upsert_repeated"].timestamp)
    assert results["upsert_repeated"].upsert_count == 3
    assert [c for c in changes if c[1] == ts] == [("insert", ts, 3, 30), ("insert", ts, 4, 40), ("insert", ts, 3, 31),
                                                  ("delete", ts, 3, None), ("delete", ts, 4, None),
                                                  ("delete", ts, 3, None)]
    assert [r for r in sealed if r[0] in (3, 4)] == [(3, 30), (4, 40)] == [r for r in growing if r[0] in (3, 4)]


def test_an_upsert_is_an_insert_then_a_delete_at_one_timestamp(repeated):
    """(c) On the channel the Insert comes first, the Delete second, with one timestamp; the delete
    hides only older rows: query returns the new row."""
    results, growing, sealed, changes = repeated
    ts = int(results["upsert_one"].timestamp)
    assert [c for c in changes if c[1] == ts] == [("insert", ts, 2, 21), ("delete", ts, 2, None)]
    assert ts > int(results["insert"].timestamp)
    assert [r for r in sealed if r[0] == 2] == [(2, 21)] == [r for r in growing if r[0] == 2]


def test_the_mirror_order_keeps_what_query_returns(repeated):
    """The channel's changes, collapsed by ``_seq``, equal what query returned."""
    import numpy as np
    import pyarrow as pa

    from msgstream_spark.mirror import collapse, seq_array

    _, _, sealed, changes = repeated
    index: dict[tuple, int] = {}
    rows = []
    for op, ts, _pk, _v in changes:  # row index inside its message: per (op, ts), in channel order
        rows.append(index.setdefault((op, ts), 0))
        index[(op, ts)] += 1
    t = pa.table({"op": [c[0] for c in changes], "pk": [c[2] for c in changes], "v": [c[3] for c in changes],
                  "_seq": seq_array(np.array([c[1] for c in changes], dtype=np.uint64),
                                    np.array([c[0] == "insert" for c in changes]), np.array(rows))})
    got = collapse(t, "pk").to_pylist()
    assert sorted((r["pk"], r["v"]) for r in got if r["op"] == "insert") == sealed


def test_source_rows_through_spark_auto_cdc_and_the_mirror_tables_equal_query(spark, milvus_stack, repeated,
                                                                              tmp_path):
    """What the real Milvus wrote, read by the Spark source: Spark's own AutoCDC engine (sequence_by=_seq)
    and the Delta and Iceberg mirrors give exactly what query returns."""
    from pyspark.sql.types import DecimalType

    from msgstream_spark.mirror import apply_batch, open_table
    from tests.mirror import autocdc
    from tests.spark.helpers import spark_options

    _, _, sealed, _ = repeated
    df = (spark.read.format("msgstream").options(**spark_options(milvus_stack.env))
          .option("channelPattern", "by-dev-rootcoord-dml_.*").option("collection", "repeated_pk").load())
    assert df.schema["_seq"].dataType == DecimalType(38, 0)
    args = autocdc.change_args(spark, ["pk"], "_seq", "op = 'delete'")
    autocdc.validate(spark, df, args)
    out = autocdc.deduplicate(spark, df, args).collect()
    assert sorted((r.pk, r.v) for r in out if r.op == "insert") == sealed
    changes = df.toArrow()
    for fmt in ("delta", "iceberg"):
        t = open_table(fmt, str(tmp_path / fmt), collection="repeated_pk", pk="pk", arrow_schema=changes.schema)
        assert apply_batch(t, changes, "pk", "q", 0)
        assert sorted((r["pk"], r["v"]) for r in t.to_arrow().to_pylist()) == sealed, fmt
