"""pulsar-lite keeps topics and subscriptions in its db file: a restart (same port, same db) in the
middle of a stream loses and duplicates nothing, and positions and named subscriptions survive."""

from __future__ import annotations

import signal
import time

import pytest

from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from tests.fixtures.pulsar_env import pulsar_config

EARLIEST = SubscriptionInitialPosition.EARLIEST


def drain(cons, n: int, timeout: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for m in cons.receive_batch(n - len(out), 1.0):
            cons.ack(m)
            out.append(m)
    return out


def msgs(lo: int, hi: int) -> list[ProducerMessage]:
    return [ProducerMessage(b"m%d" % i, {"i": str(i)}) for i in range(lo, hi)]


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_mid_stream_keeps_positions_and_the_named_subscription(pulsar_lite_broker, stop):
    b = pulsar_lite_broker
    client = pulsar_config(b.url, b.web_port, requestTimeout=20)
    from msgstream_spark.mq.pulsar.client import PulsarClient

    c = PulsarClient(client)
    ch = "restarted"
    p = c.create_producer(ch)
    ids = p.send_batch(msgs(0, 30))
    cons = c.subscribe(ch, "named", EARLIEST)
    assert [m.payload for m in drain(cons, 10)] == [b"m%d" % i for i in range(10)]
    cons.close()  # acks recorded on the broker

    b.restart(stop)  # same port, same db; the producer and the client reconnect by themselves

    ids += p.send_batch(msgs(30, 40))
    assert c.latest_message_id(ch) == ids[-1]
    assert c.first_message_id(ch) == ids[0]
    assert len(set(ids)) == 40 and ids == sorted(ids)  # ids keep growing across the restart
    r = c.reader(ch)  # a saved position still points at the same message
    r.seek(c.bytes_to_message_id(ids[5].serialize()), inclusive=True)
    assert drain(r, 1)[0].payload == b"m5"
    r.close()
    cons = c.subscribe(ch, "named", EARLIEST)  # resumes at its cursor: nothing lost, nothing twice
    got = drain(cons, 30)
    assert [m.payload for m in got] == [b"m%d" % i for i in range(10, 40)]
    assert [m.id for m in got] == ids[10:]
    assert cons.receive(0.5) is None
    cons.close()
    p.close()
    c.close()


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_consumer_open_across_a_restart_loses_nothing(pulsar_lite_broker):
    """A consumer connected through the restart: nothing lost and nothing twice (a reconnect redelivers
    what was not yet acknowledged, as on Apache Pulsar; the consumer drops what it already handed out),
    and its acks survive."""
    from msgstream_spark.mq.pulsar.client import PulsarClient

    b = pulsar_lite_broker
    c = PulsarClient(pulsar_config(b.url, b.web_port, requestTimeout=20))
    ch = "open-across"
    p = c.create_producer(ch)
    ids = p.send_batch(msgs(0, 30))
    cons = c.subscribe(ch, "named", EARLIEST)
    first = drain(cons, 10)
    took = cons.receive_batch(1, 10.0)  # sends the acks collected so far (and takes m10, not acked)
    assert [m.payload for m in took] == [b"m10"]
    # Acks are fire-and-forget: one still on its way when the broker stops is lost and its messages
    # come again. Wait until the broker has it, to check what it keeps.
    deadline = time.monotonic() + 20
    while not b.metric("pulsar_lite_subscription_acked_messages_total", subscription="named", topic=ch):
        assert time.monotonic() < deadline, "the broker never counted the ack"
        time.sleep(0.05)
    b.restart()
    ids += p.send_batch(msgs(30, 40))
    seen: dict = {}
    deadline = time.monotonic() + 30
    while len(seen) < 29 and time.monotonic() < deadline:  # the same consumer goes on after reconnecting
        for m in cons.receive_batch(100, 1.0):
            cons.ack(m)
            assert m.payload not in seen, f"{m.payload!r} handed out twice"
            seen[m.payload] = m.id
    assert [m.payload for m in first + took] + list(seen) == [b"m%d" % i for i in range(40)]
    assert [m.id for m in took] + list(seen.values()) == ids[10:]
    cons.ack(took[0])  # acknowledged after the reconnect, by the id it was handed out with
    assert cons.receive_batch(100, 0.5) == []  # no late redelivery either
    cons.close()
    cons = c.subscribe(ch, "named", EARLIEST)
    assert cons.receive(1.0) is None  # everything acknowledged, and the acks survived
    cons.close()
    p.close()
    c.close()
