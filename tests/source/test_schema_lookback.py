"""A collection whose CreateCollection and inserts lie before a busy channel's newest messages (Milvus puts every
collection on the same DML channels): more than 512 messages of another collection follow them. Schema inference
finds it by looking further back (option schemaLookback), or asks Milvus (config key milvus.address: the suite's
proxy test double, tests/milvus_proxy/, answering DescribeCollection); without either it fails naming the
collection, the channel, what was read and what to do. Real backend: the embedded log; real messages through
the codec."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import OptionError, SchemaError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import CreateCollectionMsg, InsertMsg
from msgstream_spark.source import scancache, tailscan
from msgstream_spark.source.arrow import read_table
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection
from tests.milvus_proxy.server import MilvusProxy, ProxyState
from tests.spark.helpers import MS, TS0, spark_options

WANTED, OTHER = 4242, 5151
BUSY = 700  # the other collection's inserts after the wanted one's messages: more than the first 512


def _wanted_schema(extra: str | None = None):
    s = schema_pb2.CollectionSchema(name="coll", description="the wanted collection")
    s.fields.add(fieldID=100, name="pk", is_primary_key=True, data_type=schema_pb2.DataType.Int64)
    vec = s.fields.add(fieldID=101, name="vec", data_type=schema_pb2.DataType.FloatVector)
    vec.type_params.add(key="dim", value="4")
    name = s.fields.add(fieldID=102, name="name", data_type=schema_pb2.DataType.VarChar, nullable=True)
    name.type_params.add(key="max_length", value="64")
    if extra:
        s.fields.add(fieldID=103, name=extra, data_type=schema_pb2.DataType.Int32, nullable=True)
    return s


def _insert(cid: int, name: str, pk: int, ts: int) -> InsertMsg:
    fds = [arrow_to_field_data(pa.array(np.array([pk], np.int64)),
                               field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True))]
    if cid == WANTED:
        fds += [arrow_to_field_data(pa.array([[1.0, 2.0, 3.0, 4.0]], pa.list_(pa.float32())),
                                    field_schema_from_arrow("vec", pa.list_(pa.float32()), field_id=101, dim=4)),
                arrow_to_field_data(pa.array(["n"]), field_schema_from_arrow("name", pa.string(), field_id=102,
                                                                             nullable=True))]
    return InsertMsg.build(fields_data=fds, num_rows=1, timestamp=ts, collection_id=cid, partition_id=1,
                           msg_id=pk + 1, shard_name=f"dml_0_{cid}v0", collection_name=name)


@pytest.fixture
def busy(local_env) -> str:
    return _write_busy(local_env)


def _write_busy(env) -> str:
    """A channel: the wanted collection's CreateCollection and 3 inserts, then BUSY inserts of another one."""
    ch = env.new_channel("busy")
    ts = TS0
    msgs = [CreateCollectionMsg.build(collection_id=WANTED, collection_name="coll", schema=_wanted_schema(),
                                      timestamp=ts)]
    msgs += [_insert(WANTED, "coll", i, ts + (1 + i) * MS) for i in range(3)]
    msgs += [_insert(OTHER, "other", i, ts + (10 + i) * MS) for i in range(BUSY)]
    with env.client() as c, c.create_producer(ch) as prod:
        prod.send_batch([ProducerMessage(*codec.marshal(m), timestamp=m.end_ts) for m in msgs])
    return ch


def _forget(env, ch) -> None:
    """Drop the stored scan (a later query reads only what was appended since one that found the schema)."""
    with env.client() as c:
        c.put_metadata(scancache.state_key("coll", [ch]), "")


def _opts(env, ch, **extra):
    return parse_read_options({**spark_options(env), "channels": ch, "collection": "coll", **extra},
                              streaming=False)


def test_the_lookback_finds_a_collection_behind_another_ones_messages(local_env, busy):
    schema, cid = infer_collection(_opts(local_env, busy), [busy])  # defaults: 512 first, then further back
    assert (schema, cid) == (_wanted_schema(), WANTED)  # the CreateCollection's schema, not an insert's guess


@pytest.mark.parametrize("name", ["kafka", "pulsar_lite"])
def test_the_lookback_on_kafka_and_pulsar(request, name):
    """Kafka: offsets, as the embedded log. Pulsar: the doubled window re-read inside the last ledger."""
    env = request.getfixturevalue(f"{name}_env")
    ch = _write_busy(env)
    with pytest.raises(SchemaError, match="the newest 512 messages"):
        infer_collection(_opts(env, ch, schemaLookback="512"), [ch])
    assert infer_collection(_opts(env, ch), [ch]) == (_wanted_schema(), WANTED)


def test_the_lookback_doubles_up_to_its_limit(local_env, busy, monkeypatch):
    sizes: list[int] = []
    real = tailscan.scan_tail

    def recording(client, ch, span, budget, feed, deadline):
        sizes.append(budget)
        return real(client, ch, span, budget, feed, deadline)

    monkeypatch.setattr(tailscan, "scan_tail", recording)
    _, cid = infer_collection(_opts(local_env, busy, schemaScanMessages="100", schemaLookback="1000"), [busy])
    assert cid == WANTED and sizes == [100, 100, 200, 400]  # 800 read in all: the create is 704 back
    sizes.clear()
    _forget(local_env, busy)
    with pytest.raises(SchemaError):
        infer_collection(_opts(local_env, busy, schemaScanMessages="100", schemaLookback="600"), [busy])
    assert sizes == [100, 100, 200, 200]  # stops at the limit


def test_without_milvus_or_lookback_the_error_says_what_was_read_and_what_to_do(local_env, busy):
    with pytest.raises(SchemaError) as err:
        infer_collection(_opts(local_env, busy, schemaLookback="512"), [busy])
    text = str(err.value)
    for part in ("collection 'coll'", busy, f"{busy}: the newest 512 messages", "schemaLookback=512",
                 "set config key milvus.address", "raise option schemaLookback", "option schema"):
        assert part in text, (part, text)
    # the failed scan stored nothing for the channel: a query with the default lookback looks back and finds it
    assert infer_collection(_opts(local_env, busy), [busy])[1] == WANTED


def test_the_lookback_option_is_checked(local_env, busy):
    assert _opts(local_env, busy).schema_lookback == tailscan.LOOKBACK == 65536
    assert _opts(local_env, busy, schemaLookback="0").schema_lookback == 0
    with pytest.raises(OptionError, match="schemaLookback must be an integer >= 0"):
        _opts(local_env, busy, schemaLookback="-1")


@pytest.fixture
def milvus(tmp_path):
    """The proxy test double describing collection ``coll`` (with a field no message of the channel has)."""
    state = ProxyState()
    state.collections[("default", "coll")] = (WANTED, ["by-dev-rootcoord-dml_0"], ["by-dev-rootcoord-dml_0_v0"])
    state.schemas[("default", "coll")] = _wanted_schema("added").SerializeToString()
    proxy = MilvusProxy(str(tmp_path / "wal.db"), state).start()
    yield proxy
    proxy.stop()


def test_with_milvus_address_the_schema_is_milvus_s(local_env, busy, milvus):
    opts = _opts(local_env, busy, schemaLookback="512", **{"milvus.address": milvus.address,
                                                            "milvus.requestTimeout": "10"})
    schema, cid = infer_collection(opts, [busy])  # the channel alone would fail: lookback 512
    assert (schema, cid) == (_wanted_schema("added"), WANTED)


def test_a_collection_milvus_does_not_know_falls_back_to_the_channels(local_env, busy, milvus):
    milvus_opts = {"milvus.address": milvus.address, "milvus.requestTimeout": "10"}
    del milvus.state.collections[("default", "coll")]
    assert infer_collection(_opts(local_env, busy, **milvus_opts), [busy])[1] == WANTED  # by the lookback
    _forget(local_env, busy)
    with pytest.raises(SchemaError) as err:
        infer_collection(_opts(local_env, busy, schemaLookback="512", **milvus_opts), [busy])
    assert "DescribeCollection at milvus.address failed" in str(err.value)
    assert "not found" in str(err.value) and "set config key milvus.address" not in str(err.value)


def test_the_library_read_gives_the_collection_s_rows(local_env, busy, milvus):
    """``read_table`` (the source's read without Spark): the rows of the wanted collection only, its schema found
    by the lookback, and with a Config naming Milvus, Milvus's (the described field ``added`` is a column)."""
    by_lookback = read_table(local_env.config, [busy], collection="coll")
    assert by_lookback.column("pk").to_pylist() == [0, 1, 2] and "added" not in by_lookback.column_names
    cfg = local_env.config.with_overrides({"milvus.address": milvus.address, "milvus.requestTimeout": 10})
    by_milvus = read_table(cfg, [busy], collection="coll", schemaLookback="512")
    assert by_milvus.column("pk").to_pylist() == [0, 1, 2]
    assert by_milvus.column("added").to_pylist() == [None, None, None]
