"""Schema inference and the messages builder skip what does not decode (a DecodeError, logged with
channel and position) and let anything else through: a codec bug must not become a silently wrong
inferred schema or a blank column. Data: the independent test producers (tests/wal26/producer.py)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.source import rows as R
from msgstream_spark.source import schema as S
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.rows import MessagesBuilder, messages_arrow_schema
from tests.spark import wal26_data as W
from tests.spark.helpers import spark_options

CORRUPT = ProducerMessage(b"\xff\xff\xff", {"msg_type": "Insert"}, 1)


def _opts(env, ch):
    return parse_read_options({**spark_options(env), "channels": ch}, streaming=None)


def _send(env, ch, msgs):
    with env.client() as c, c.create_producer(ch) as prod:
        return W.send(prod, msgs)


def _raw(env, ch):
    with env.client() as c:
        cons = c.reader(ch)
        try:
            cons.seek(c.earliest_message_id(), inclusive=True)
            return cons.receive_batch(16, 2.0)
        finally:
            cons.unsubscribe()


def test_a_corrupt_message_is_skipped_and_logged_with_channel_and_position(local_env, caplog):
    ch = local_env.new_channel("corrupt")
    _send(local_env, ch, [CORRUPT, W.old_insert([1, 2], W.TT)])
    with caplog.at_level(logging.WARNING, logger=S.__name__):
        schema, pk, _ = S.infer_arrow(_opts(local_env, ch), [ch])
    assert pk == "pk" and "vec" in schema.names
    assert any(ch in r.getMessage() and "msgID(base64)=" in r.getMessage() for r in caplog.records)


def test_a_codec_bug_in_a_25_decode_surfaces(local_env, monkeypatch):
    ch = local_env.new_channel("bug25")
    _send(local_env, ch, [W.old_insert([1, 2], W.TT)])

    def broken(*_a, **_k):
        raise TypeError("codec bug")

    monkeypatch.setattr(codec, "unmarshal", broken)
    with pytest.raises(TypeError, match="codec bug"):  # was: SchemaError "cannot infer a schema"
        S.infer_arrow(_opts(local_env, ch), [ch])


def test_a_codec_bug_in_a_26_decode_surfaces(local_env, monkeypatch):
    ch = local_env.new_channel("bug26")
    W.write_mixed(local_env, ch)

    def broken(*_a, **_k):
        raise TypeError("codec bug")

    monkeypatch.setattr(S, "decode_message", broken)
    with pytest.raises(TypeError, match="codec bug"):  # was: the schema of the 2.5 insert, silently
        S.infer_arrow(_opts(local_env, ch), [ch])


def test_the_messages_builder_skips_decode_errors_but_not_codec_bugs(local_env, monkeypatch):
    ch = local_env.new_channel("raw")
    _send(local_env, ch, [CORRUPT, ProducerMessage(b"\xff", {"_v": "x"}, 2)])
    corrupt, bad_envelope = _raw(local_env, ch)
    b = MessagesBuilder(messages_arrow_schema())
    b.add_raw(corrupt, None)
    b.add_raw(bad_envelope, None)  # _v that does not parse: no envelope columns, no error
    rows = pa.Table.from_batches(b.flush()).to_pylist()
    assert [r["msg_type"] for r in rows] == ["Insert", None] and rows[1]["version"] is None

    def broken(*_a, **_k):
        raise TypeError("codec bug")

    monkeypatch.setattr(codec, "peek_msg_type", broken)
    with pytest.raises(TypeError, match="codec bug"):
        b.add_raw(corrupt, None)
    monkeypatch.setattr(R, "parse_envelope", broken)
    with pytest.raises(TypeError, match="codec bug"):
        b.add_raw(bad_envelope, None)
