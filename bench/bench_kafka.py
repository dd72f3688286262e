"""Kafka backend throughput against a bare confluent-kafka loop, same payloads, same run.

Starts its own tansu broker on loopback (or uses MSGSTREAM_TEST_KAFKA). Both sides connect before
the clock starts; both learn the offset of every produced message. Runs are interleaved (bare,
ours, bare, ours...) and the ratios are of the medians. Consume is measured twice: through
``receive_batch`` (a Message per record) and through the bulk ``receive_raw`` (what the Spark read
tasks need: payloads and offsets). Goal: >= 0.9 of bare, at 1 KiB and at 64 KiB payloads.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid

from bench._util import broker_comparison
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.kafka.client import KafkaClient

BATCH = 1000


def _bare(bootstrap: str, payloads: list[bytes]) -> tuple[float, float]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"bare-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": bootstrap, "compression.codec": "zstd", "linger.ms": 2,
                  "enable.idempotence": True, "message.max.bytes": 10485760})
    p.produce(topic, value=b"warm-up", partition=0)  # topic creation outside the timing
    p.flush(60)
    offsets: list[int] = []  # like the backend (and Milvus), learn where each message landed

    def on_delivery(err, msg) -> None:
        offsets.append(msg.offset())

    t0 = time.perf_counter()
    for s in range(0, len(payloads), BATCH):
        for x in payloads[s:s + BATCH]:
            p.produce(topic, value=x, partition=0, headers=[("msg_type", b"Insert")], on_delivery=on_delivery)
        p.flush(60)
    t_prod = time.perf_counter() - t0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False})
    # connect and resolve the group before the clock starts, as the backend's subscribe() does
    c.committed([TopicPartition(topic, 0)], timeout=30)
    c.assign([TopicPartition(topic, 0, -2)])
    t0 = time.perf_counter()
    n = 0
    while n < len(payloads) + 1:
        first = c.poll(5.0)
        if first is None:
            break
        for m in [first, *c.consume(num_messages=1023, timeout=0)]:
            m.value(), m.headers(), m.offset()  # what any consumer reads of a message
            n += 1
    t_cons = time.perf_counter() - t0
    c.close()
    return t_prod, t_cons


def _ours(bootstrap: str, payloads: list[bytes]) -> tuple[float, float, float]:
    client = KafkaClient(Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": bootstrap}}))
    ch = f"ours-{uuid.uuid4().hex[:8]}"
    prod = client.create_producer(ch)
    msgs = [ProducerMessage(x, {"msg_type": "Insert"}) for x in payloads]
    prod.send(ProducerMessage(b"warm-up"))  # topic metadata outside the timing, as for the bare loop
    t0 = time.perf_counter()
    for s in range(0, len(msgs), BATCH):
        prod.send_batch(msgs[s:s + BATCH])
    t_prod = time.perf_counter() - t0
    t_cons = _consume(client, ch, len(msgs), bulk=False)
    t_raw = _consume(client, ch, len(msgs), bulk=True)
    prod.close()
    client.close()
    return t_prod, t_cons, t_raw


def _consume(client: KafkaClient, ch: str, count: int, bulk: bool) -> float:
    """Seconds to read the channel through receive_batch (Message objects) or receive_raw."""
    cons = client.subscribe(ch, f"{ch}-{int(bulk)}", SubscriptionInitialPosition.EARLIEST)
    t0 = time.perf_counter()
    n = 0
    while n < count + 1:
        got = cons.receive_raw(1024, 5.0) if bulk else cons.receive_batch(1024, 5.0)
        if not got:
            break
        n += len(got)
    t = time.perf_counter() - t0
    cons.unsubscribe()
    return t


def run() -> dict:
    external = os.environ.get("MSGSTREAM_TEST_KAFKA")
    with contextlib.ExitStack() as stack:
        if external:
            bootstrap = external
        else:
            from tests.fixtures.tansu import TansuBroker

            bootstrap = stack.enter_context(TansuBroker()).bootstrap
        _bare(bootstrap, [b"w" * 1024] * 2000)  # warm up
        # 50k small messages: at ~400k msgs/s a 20k run lasts 50 ms, too short to time on a busy machine
        return broker_comparison("confluent-kafka", lambda p: _bare(bootstrap, p), lambda p: _ours(bootstrap, p),
                                 cases=[(1024, 50_000), (64 * 1024, 5_000)])


if __name__ == "__main__":
    run()
