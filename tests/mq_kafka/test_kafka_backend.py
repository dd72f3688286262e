"""Kafka specifics: broker faults, Milvus byte encoding of positions, config, secrets."""

from __future__ import annotations

import threading
import time

import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendError, ChannelNotFoundError, ConfigError, DecodeError
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.kafka.client import KafkaClient
from msgstream_spark.msg.position import MsgPosition
from tests.fixtures.kafka_env import kafka_config

TS = 455000614502400000


def drain(cons, n, timeout=30.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += cons.receive_batch(n - len(out), 1.0)
    return out


def test_positions_use_milvus_kafka_encoding(kafka_env):
    c = kafka_env.client()
    ch = kafka_env.new_channel()
    with c.create_producer(ch) as p:
        ids = p.send_batch([ProducerMessage(b"m%d" % i, timestamp=TS + i) for i in range(43)])
    assert ids[42].serialize() == bytes.fromhex("2a00000000000000")
    with c.subscribe(ch, "enc") as cons:
        got = drain(cons, 43)
    pos = MsgPosition("by-dev-rootcoord-dml_0", got[42].id.serialize(), "g", TS)
    want = (bytes.fromhex("0a16") + b"by-dev-rootcoord-dml_0" + bytes.fromhex("12082a00000000000000")
            + bytes.fromhex("1a016720") + bytes.fromhex("80808080df949fa806"))
    assert pos.to_proto_bytes() == want
    assert got[42].timestamp == TS + 42  # exact hybrid ts survives (ms record timestamps lose it)
    with pytest.raises(DecodeError, match="8 bytes"):
        c.bytes_to_message_id(b"\x01")
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_broker_paused_during_produce_and_consume_delivers_once_in_order(kafka_broker):
    c = KafkaClient(kafka_config(kafka_broker.bootstrap))
    ch = "paused"
    p = c.create_producer(ch)
    p.send_batch([ProducerMessage(b"a%d" % i) for i in range(10)])
    cons = c.subscribe(ch, "paused-sub", SubscriptionInitialPosition.EARLIEST)
    first = drain(cons, 10)
    kafka_broker.pause()
    resumer = threading.Timer(3.0, kafka_broker.resume)
    resumer.start()
    try:
        ids = p.send_batch([ProducerMessage(b"b%d" % i) for i in range(20)])  # blocks until SIGCONT
        rest = drain(cons, 20)
    finally:
        resumer.join()
        kafka_broker.resume()
    assert [m.payload for m in first + rest] == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(20)]
    assert [m.id for m in rest] == ids
    assert cons.receive(1.0) is None  # nothing twice
    cons.close()
    p.close()
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_broker_killed_gives_a_clear_error_within_the_timeout(kafka_broker):
    c = KafkaClient(kafka_config(kafka_broker.bootstrap, requestTimeout=3, readTimeout=3))
    p = c.create_producer("doomed")
    p.send(ProducerMessage(b"x"))
    kafka_broker.kill()
    t0 = time.monotonic()
    with pytest.raises(BackendError) as ei:
        p.send_batch([ProducerMessage(b"y%d" % i) for i in range(5)])
    assert time.monotonic() - t0 < 30
    assert "doomed" in str(ei.value) and len(ei.value.failures) == 5  # every message reported
    t0 = time.monotonic()
    with pytest.raises(BackendError):
        c.latest_message_id("doomed")
    assert time.monotonic() - t0 < 30
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_unreachable_broker_is_a_bounded_clear_error():
    from tests.fixtures.tansu import free_port

    c = KafkaClient(kafka_config(f"127.0.0.1:{free_port()}", requestTimeout=2))
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="refused"):
        c.create_producer("nowhere")
    assert time.monotonic() - t0 < 20


def test_topic_creation_can_be_disabled(kafka_env):
    cfg = kafka_env.config.with_overrides({"kafka.createTopics": False})
    c = KafkaClient(cfg)
    with pytest.raises(ChannelNotFoundError, match="kafka.createTopics is false"):
        c.create_producer(kafka_env.new_channel("nocreate"))
    c.close()


def test_sasl_config_rules_and_secret_masking():
    with pytest.raises(ConfigError, match="saslUsername and kafka.saslPassword must be set together"):
        KafkaClient(Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": "h:1", "saslUsername": "u"}}))
    cfg = Config.from_dict({"mq": {"type": "kafka"}, "kafka": {
        "brokerList": "h:1", "saslUsername": "alice", "saslPassword": "hunter2-secret",
        "saslMechanisms": "SCRAM-SHA-512",
        "securityProtocol": "SASL_SSL", "producer": {"linger.ms": 9}}})
    c = KafkaClient(cfg)
    assert "hunter2-secret" not in repr(c) and "******" in repr(c)
    conf = c.settings.producer_conf()
    assert conf["sasl.password"] == "hunter2-secret" and conf["linger.ms"] == 9
    assert conf["compression.codec"] == "zstd" and conf["enable.idempotence"] is True
    assert c.settings.consumer_conf("g")["enable.auto.commit"] is False


def test_a_reader_leaves_nothing_on_the_broker_without_an_admin_round_trip(kafka_env, monkeypatch):
    """A reader (every Spark read task's consumer) reads from a seek and goes: its random group never committed, so
    going asks the broker nothing more (it deleted the group through a new admin client each time: 8-30 ms a
    read range on tansu); a subscription that committed still has its group deleted when it unsubscribes."""
    from confluent_kafka.admin import AdminClient

    c = kafka_env.client()
    ch = kafka_env.new_channel()
    with c.create_producer(ch) as p:
        p.send_batch([ProducerMessage(b"m%d" % i, timestamp=TS + i) for i in range(5)])
    admins: list[str] = []

    def counted(conf):
        admins.append("admin")
        return AdminClient(conf)

    monkeypatch.setattr("confluent_kafka.admin.AdminClient", counted)
    r = c.reader(ch)
    r.seek(c.earliest_message_id())
    assert [m.payload for m in drain(r, 5)] == [b"m%d" % i for i in range(5)]
    group = r.subscription
    r.unsubscribe()
    assert admins == []
    named = c.subscribe(ch, f"named-{group[-6:]}", SubscriptionInitialPosition.EARLIEST)
    got = drain(named, 5)
    named.ack(got[-1])
    named.close()  # commits
    named = c.subscribe(ch, f"named-{group[-6:]}", SubscriptionInitialPosition.EARLIEST)
    named.unsubscribe()
    assert admins == ["admin"]  # a group that committed is deleted
    c.close()
