"""Pulsar specifics: Milvus's MessageIdData bytes, subscriptions kept on close, auth and secrets, faults."""

from __future__ import annotations

import logging
import pickle
import threading
import time

import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendError, ConfigError, DataLossError, DecodeError, ProduceError
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.pulsar.client import PulsarClient
from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
from msgstream_spark.msg.position import MsgPosition
from tests.fixtures.pulsar_env import pulsar_config
from tests.fixtures.tansu import free_port
from tests.pulsar_broker import PulsarTestBroker

pytestmark = pytest.mark.timeout(180)
EARLIEST = SubscriptionInitialPosition.EARLIEST
TS = 455000614502400000


def drain(cons, n, timeout=30.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += cons.receive_batch(n - len(out), 1.0)
    return out


def client_for(broker: PulsarTestBroker, **pulsar) -> PulsarClient:
    return PulsarClient(pulsar_config(broker.url, broker.web_port, **pulsar))


# -- MessageIdData bytes (wire doc §3.3) --------------------------------------------------------------------
def test_message_id_bytes_are_milvus_25_and_all_forms_are_read():
    mid = PulsarMessageID(12, 3)
    assert mid.serialize() == bytes.fromhex("080c100318002000 3001".replace(" ", ""))
    v24 = PulsarMessageID.deserialize(bytes.fromhex("080c100318002000"))  # Milvus 2.4: no batch_size
    client_form = PulsarMessageID.deserialize(bytes.fromhex("080c1003"))  # the Python client's own bytes
    assert v24 == mid == client_form
    assert client_form.serialize() == mid.serialize()
    earliest = PulsarMessageID.earliest()
    assert earliest.serialize() == bytes.fromhex("08" + "ff" * 9 + "01" + "10" + "ff" * 9 + "01" + "18" + "ff" * 9
                                                 + "01" + "20" + "ff" * 9 + "0130" + "00")
    assert PulsarMessageID.deserialize(earliest.serialize()).at_earliest_position()
    assert PulsarMessageID(12, 3) < PulsarMessageID(12, 4) < PulsarMessageID(13, 0)
    assert pickle.loads(pickle.dumps(mid)) == mid
    with pytest.raises(DecodeError, match="without ledgerId"):
        PulsarMessageID.deserialize(bytes.fromhex("1003"))
    with pytest.raises(DecodeError, match="malformed"):
        PulsarMessageID.deserialize(bytes.fromhex("08ff"))


def test_ids_from_the_broker_are_written_in_milvus_form(pulsar_env):
    c = pulsar_env.client()
    ch = pulsar_env.new_channel()
    with c.create_producer(ch) as p:
        ids = p.send_batch([ProducerMessage(b"m%d" % i, {"msg_type": "Insert"}, timestamp=TS + i) for i in range(4)])
    with c.subscribe(ch, "enc", EARLIEST) as cons:
        got = drain(cons, 4)
    assert [m.id for m in got] == ids
    raw = got[3].id.serialize()
    assert raw.endswith(bytes.fromhex("18002000" "3001")) and raw[0] == 0x08
    assert c.bytes_to_message_id(raw) == ids[3]
    assert got[3].timestamp == TS + 3 and got[3].properties == {"msg_type": "Insert"}
    pos = MsgPosition(ch, raw, "sub", TS + 3)
    assert MsgPosition.from_proto_bytes(pos.to_proto_bytes()).msg_id == raw
    c.close()


# -- subscriptions ----------------------------------------------------------------------------------------
def test_close_keeps_a_named_subscription_and_probes_and_readers_are_removed(pulsar_env):
    broker = pulsar_env.extras["broker"]
    if broker is None:
        pytest.skip("inspects the suite's own broker")
    c = pulsar_env.client()
    ch = pulsar_env.new_channel()
    topic = c.settings.topic(ch)
    with c.create_producer(ch) as p:
        p.send_batch([ProducerMessage(b"%d" % i, timestamp=TS + i) for i in range(5)])
    with c.subscribe(ch, "named", EARLIEST) as cons:
        for m in drain(cons, 2):
            cons.ack(m)
    assert c.first_message_id(ch) == PulsarMessageID(broker.topics[topic].ledger, 0)
    assert c.message_id_at_timestamp(ch, TS + 3).entry == 3
    assert c.latest_message_id(ch).entry == 4
    r = c.reader(ch)
    r.seek(c.earliest_message_id())
    assert len(drain(r, 5)) == 5
    names = broker.subscription_names(topic)
    assert "named" in names and len(names) == 2 and any(n.startswith("__msgstream_reader") for n in names)
    r.close()  # a reader's subscription is non-durable: gone with the reader
    assert broker.subscription_names(topic) == ["named"]  # probes are removed right after use
    c.close()
    assert broker.mark_delete(topic, "named") == 1


def test_seek_to_a_removed_position_is_data_loss(pulsar_env):
    c = pulsar_env.client()
    ch = pulsar_env.new_channel()
    with c.create_producer(ch) as p:
        ids = p.send_batch([ProducerMessage(b"%d" % i) for i in range(3)])
    gone = PulsarMessageID(ids[0].ledger - 1, 5)  # a ledger retention has removed
    with c.subscribe(ch, "loss", SubscriptionInitialPosition.UNKNOWN) as cons:
        cons.seek(gone)
        with pytest.raises(DataLossError, match="no longer retained"):
            drain(cons, 1)
    c.close()


def test_list_channels_through_the_admin_api(pulsar_env):
    c = pulsar_env.client()
    ch = pulsar_env.new_channel("listed")
    c.create_producer(ch).close()
    c.put_metadata("k", "v")
    names = c.list_channels()
    assert ch in names and not any(n.startswith("__") for n in names)
    bad = PulsarClient(pulsar_env.config.with_overrides({"pulsar.webport": free_port(), "pulsar.requestTimeout": 3}))
    with pytest.raises(BackendError, match="pulsar.webport"):
        bad.list_channels()
    c.close()


# -- config, auth and secrets -----------------------------------------------------------------------------
def test_address_forms_and_config_errors():
    def settings(**pulsar):
        return PulsarClient(Config.from_dict({"mq": {"type": "pulsar"}, "pulsar": pulsar})).settings

    assert settings(address="broker", port=6651).service_url == "pulsar://broker:6651"
    assert settings(address="broker:7000").service_url == "pulsar://broker:7000"
    assert settings(address="pulsar+ssl://b:6651").web_url.startswith("https://b:")
    assert settings(address="b", tenant="t", namespace="n").topic("c") == "persistent://t/n/c"
    with pytest.raises(ConfigError, match="pulsar.address"):
        settings(address="")
    with pytest.raises(ConfigError, match="pulsar.authPlugin has unsupported"):
        settings(address="b", authPlugin="kerberos")
    with pytest.raises(ConfigError, match="tlsCertFile"):
        settings(address="b", authPlugin="tls", authParams="tlsCertFile:/x")
    with pytest.raises(ConfigError, match="authPlugin is empty"):
        settings(address="b", authParams="token:abc")
    tls = settings(address="b", authPlugin="tls", authParams="tlsCertFile:/c.pem,tlsKeyFile:/k.pem")
    assert tls.auth_kind == "tls"


def test_token_auth_works_and_the_token_is_never_shown(caplog):
    caplog.set_level(logging.DEBUG)
    token = "eyJhbGciOiJIUzI1NiJ9.super-secret-token"
    with PulsarTestBroker(token=token) as broker:
        good = client_for(broker, authPlugin="token", authParams=f"token:{token}", requestTimeout=5)
        with good.create_producer("authed") as p:
            p.send(ProducerMessage(b"ok"))
        assert good.latest_message_id("authed") is not None
        assert token not in repr(good) and token not in good.settings.describe()
        assert token not in repr(pickle.loads(pickle.dumps(good)))
        good.close()
        bad = client_for(broker, authPlugin="org.apache.pulsar.client.impl.auth.AuthenticationToken",
                         authParams='{"token": "wrong-token-value"}', requestTimeout=3)
        with pytest.raises(BackendError) as ei:
            bad.create_producer("authed")
        assert "wrong-token-value" not in str(ei.value) and "auth=token" in str(ei.value)
        bad.close()
    assert token not in caplog.text and "wrong-token-value" not in caplog.text


# -- faults -----------------------------------------------------------------------------------------------
@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_unreachable_broker_is_a_bounded_clear_error():
    c = PulsarClient(pulsar_config(f"pulsar://127.0.0.1:{free_port()}", free_port(), requestTimeout=2))
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="127.0.0.1") as ei:
        c.create_producer("nowhere")
    assert "pulsar.requestTimeout=2" in str(ei.value) or "cannot reach" in str(ei.value)
    assert time.monotonic() - t0 < 30
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_connections_dropped_mid_stream_lose_and_duplicate_nothing(pulsar_broker):
    c = client_for(pulsar_broker)
    ch = "faulty"
    n = 3000
    with c.subscribe(ch, "reader", EARLIEST) as cons:
        received: list[bytes] = []
        with c.create_producer(ch) as p:
            done = threading.Event()
            errors: list[Exception] = []

            def produce() -> None:
                try:
                    for s in range(0, n, 100):
                        p.send_batch([ProducerMessage(b"%d" % i) for i in range(s, s + 100)])
                except Exception as exc:  # noqa: BLE001 - asserted below
                    errors.append(exc)
                finally:
                    done.set()

            t = threading.Thread(target=produce)
            t.start()
            drops = 0
            while not done.is_set() or len(received) < n:
                batch = cons.receive_batch(500, 1.0)
                for m in batch:
                    cons.ack(m)
                received += [m.payload for m in batch]
                if drops < 3 and len(received) > (drops + 1) * 600:
                    pulsar_broker.drop_connections()  # producer and consumer connections alike
                    drops += 1
                if done.is_set() and not batch:
                    break
            t.join(60)
        assert errors == [] and drops == 3
    stored = pulsar_broker.entry_count(c.settings.topic(ch))
    assert stored == n  # resends after reconnecting were not stored twice
    ints = [int(x) for x in received]
    assert set(ints) == set(range(n))  # nothing lost
    # at-least-once for what was not acknowledged when the connection dropped: any repeat comes
    # again in order, so the first occurrences are exactly 0..n-1 in order
    first_seen = list(dict.fromkeys(ints))
    assert first_seen == list(range(n))
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_broker_gone_gives_a_clear_error_within_the_timeout():
    broker = PulsarTestBroker().start()
    c = client_for(broker, requestTimeout=2)
    p = c.create_producer("doomed")
    p.send(ProducerMessage(b"x"))
    cons = c.subscribe("doomed", "s", EARLIEST)
    assert drain(cons, 1)[0].payload == b"x"
    broker.stop()
    t0 = time.monotonic()
    with pytest.raises(ProduceError) as ei:
        p.send_batch([ProducerMessage(b"y%d" % i) for i in range(5)])
    assert "doomed" in str(ei.value) and len(ei.value.failures) == 5
    assert cons.receive_batch(10, 1.0) == []
    with pytest.raises(BackendError):
        c.latest_message_id("other-channel")
    assert time.monotonic() - t0 < 60
    c.close()


def test_message_over_max_message_size_is_reported_and_later_ones_not_sent(pulsar_env):
    c = PulsarClient(pulsar_env.config.with_overrides({"pulsar.maxMessageSize": 1000}))
    ch = pulsar_env.new_channel()
    with c.create_producer(ch) as p:
        with pytest.raises(ProduceError, match="pulsar.maxMessageSize=1000") as ei:
            p.send_batch([ProducerMessage(b"a"), ProducerMessage(b"x" * 1001), ProducerMessage(b"b")])
    assert [i for i, _ in ei.value.failures] == [1, 2]
    assert ei.value.ids[0] is not None and ei.value.ids[1:] == [None, None]
    c.close()


def test_in_order_and_out_of_order_acks_both_stick(pulsar_env):
    # in-order acks collapse into a cumulative ack; an ack past a gap is sent on its own
    c = pulsar_env.client()
    ch = pulsar_env.new_channel()
    with c.create_producer(ch) as p:
        p.send_batch([ProducerMessage(b"%d" % i) for i in range(6)])
    with c.subscribe(ch, "acks", EARLIEST) as cons:
        got = drain(cons, 6)
        for i in (0, 1, 2, 4):
            cons.ack(got[i])
    with c.subscribe(ch, "acks", EARLIEST) as cons:
        assert [m.payload for m in drain(cons, 2)] == [b"3", b"5"]
        assert cons.receive(0.3) is None
    c.close()
