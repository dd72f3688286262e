"""The Spark-free read core's entry point on the embedded log: ``read_arrow`` gives the rows the Spark
partitions give (the same plan and per-range read), options and config forms, the ``rows`` CLI command.
Data: the independent 2.6 test producer (tests/wal26/producer.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from msgstream_spark.cli.main import main
from msgstream_spark.errors import OptionError
from msgstream_spark.source import read_arrow, read_table
from tests.sink.helpers import config_file
from tests.spark import wal26_data as W


@pytest.fixture
def wal_channel(local_env):
    ch = local_env.new_channel("wal")
    W.write_mixed(local_env, ch)
    return ch


def _key(rows):
    return sorted((r["op"], r["pk"], r["_ts"]) for r in rows)


def test_rows_equal_the_partition_read_and_what_milvus_applies(local_env, wal_channel):
    batches = list(read_arrow(local_env.config, [wal_channel]))
    assert batches and all(isinstance(b, pa.RecordBatch) for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    assert _key(rows) == sorted(W.expected_rows())
    assert rows == W.read_direct(local_env, wal_channel)  # the Spark partitions' read, value for value
    assert batches[0].schema.names[:3] == ["op", "pk", "vec"] and batches[0].schema.names[-2:] == ["_position", "_seq"]


def test_messages_output_and_options(local_env, wal_channel):
    msgs = read_table(local_env.config, wal_channel, output="messages").to_pylist()
    assert msgs == W.read_direct(local_env, wal_channel, output="messages")
    assert {m["channel"] for m in msgs} == {wal_channel}
    only = read_table(local_env.config, wal_channel, messageTypes="insert", endingTimestamp=W.TT + 4)
    assert sorted(only.column("pk").to_pylist()) == [1, 2, 3, 4]
    with pytest.raises(OptionError, match="endingTimestamp|endingtimestamp"):
        read_arrow(local_env.config, wal_channel, endingTimestamp="not a time")


def test_config_forms_and_the_schema_option(local_env, wal_channel, tmp_path):
    path = local_env.config.get("local.path")
    as_dict = read_table({"mq": {"type": "local"}, "local": {"path": path}}, wal_channel)
    as_options = read_table(None, wal_channel, **{"mq.type": "local", "local.path": path})
    as_file = read_table(config_file(local_env, tmp_path), wal_channel)
    assert as_dict.to_pylist() == as_options.to_pylist() == as_file.to_pylist()
    given = read_table(local_env.config, wal_channel, schema="pk bigint, vec array<float>")
    assert given.column_names[:3] == ["op", "pk", "vec"] and given.schema.field("vec").type == pa.list_(pa.float32())
    assert _key(given.to_pylist()) == sorted(W.expected_rows())
    with pytest.raises(OptionError, match="column pk"):
        read_table(local_env.config, wal_channel, schema="pk struct<a:int>")


def test_cli_rows_prints_the_read_as_json_lines(local_env, wal_channel, tmp_path, capsys):
    code = main(["rows", "--config", config_file(local_env, tmp_path), "-c", wal_channel])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert _key(lines) == sorted(W.expected_rows())
    assert all(isinstance(r["_event_time"], str) and isinstance(r["_msg_id"], str) for r in lines)
    code = main(["rows", "--config", config_file(local_env, tmp_path), "-c", wal_channel, "--output", "messages",
                 "-n", "3", "-o", "messageTypes=insert"])
    out, _ = capsys.readouterr()
    assert code == 0 and [json.loads(x)["msg_type"] for x in out.splitlines()] == ["Insert"] * 3


def test_read_tasks_take_no_write_lock_and_open_the_log_once(local_env, wal_channel, monkeypatch):
    """A read task of several channels on the embedded log: one client (one SQLite open) for all its ranges, and no
    write lock taken, so it reads while another connection holds a write transaction (local.busyTimeout=0: any
    wait for the lock fails at once). Before: each range opened a client and a consumer connection, and both, the
    reader's subscription and its removal took the write lock."""
    import sqlite3

    from msgstream_spark.mq.local import store
    from msgstream_spark.source.arrow import _read, plan_read, read_options

    other = local_env.new_channel("wal2")
    W.write_mixed(local_env, other)
    schema, ranges = plan_read(read_options(local_env.config, [wal_channel, other], **{"local.busyTimeout": "0"}))
    assert len(ranges) == 2
    opened = []
    real_open = store.open_db
    monkeypatch.setattr(store, "open_db", lambda s: opened.append(s.path) or real_open(s))
    writer = sqlite3.connect(local_env.config.get("local.path"), isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another connection's write transaction, held for the whole read
    try:
        rows = [r for b in _read(schema, ranges) for r in b.to_pylist()]  # read_arrow's tasks, after its plan
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert _key(rows) == sorted(W.expected_rows() * 2)
    assert {r["_channel"] for r in rows} == {wal_channel, other}
    assert len(opened) == 1 + len(ranges)  # the task's client, and a consumer connection per channel
