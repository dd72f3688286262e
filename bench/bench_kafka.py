"""Kafka backend throughput against a bare confluent-kafka loop, same payloads, same run.

Starts its own tansu broker on loopback (or uses MSGSTREAM_TEST_KAFKA). Goal: >= 0.8 of bare.
"""

from __future__ import annotations

import os
import time
import uuid

from bench._util import table
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.kafka.client import KafkaClient

MESSAGES, SIZE, BATCH = 20_000, 1024, 1000


def _bare(bootstrap: str, payloads: list[bytes]) -> tuple[float, float]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"bare-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": bootstrap, "compression.codec": "zstd", "linger.ms": 2,
                  "enable.idempotence": True, "message.max.bytes": 10485760})
    p.produce(topic, value=b"warm-up", partition=0)  # topic creation outside the timing
    p.flush(60)
    t0 = time.perf_counter()
    for s in range(0, len(payloads), BATCH):
        for x in payloads[s:s + BATCH]:
            p.produce(topic, value=x, partition=0, headers=[("msg_type", b"Insert")])
        p.flush(60)
    t_prod = time.perf_counter() - t0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False})
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


def _ours(bootstrap: str, payloads: list[bytes]) -> tuple[float, float]:
    client = KafkaClient(Config.from_dict({"mq": {"type": "kafka"}, "kafka": {"brokerList": bootstrap}}))
    ch = f"ours-{uuid.uuid4().hex[:8]}"
    prod = client.create_producer(ch)
    msgs = [ProducerMessage(x, {"msg_type": "Insert"}) for x in payloads]
    prod.send(ProducerMessage(b"warm-up"))  # topic metadata outside the timing, as for the bare loop
    t0 = time.perf_counter()
    for s in range(0, len(msgs), BATCH):
        prod.send_batch(msgs[s:s + BATCH])
    t_prod = time.perf_counter() - t0
    cons = client.subscribe(ch, ch, SubscriptionInitialPosition.EARLIEST)
    t0 = time.perf_counter()
    n = 0
    while n < len(msgs) + 1:
        got = cons.receive_batch(1024, 5.0)
        if not got:
            break
        n += len(got)
    t_cons = time.perf_counter() - t0
    cons.close()
    prod.close()
    client.close()
    return t_prod, t_cons


def run() -> dict:
    payloads = [bytes([i % 251]) * SIZE for i in range(MESSAGES)]
    external = os.environ.get("MSGSTREAM_TEST_KAFKA")
    if external:
        bp, bc = _bare(external, payloads)
        op, oc = _ours(external, payloads)
    else:
        from tests.fixtures.tansu import TansuBroker

        with TansuBroker() as broker:
            _bare(broker.bootstrap, payloads[:2000])  # warm up
            bp, bc = _bare(broker.bootstrap, payloads)
            op, oc = _ours(broker.bootstrap, payloads)
    n = len(payloads)
    res = {"messages": n, "payload_bytes": SIZE, "bare_produce_msgs_s": n / bp, "produce_msgs_s": n / op,
           "bare_consume_msgs_s": n / bc, "consume_msgs_s": n / oc, "produce_ratio": bp / op,
           "consume_ratio": bc / oc}
    print(table([("bare confluent-kafka produce", n / bp, None), ("backend send_batch", n / op, bp / op),
                 ("bare confluent-kafka consume", n / bc, None), ("backend receive_batch", n / oc, bc / oc)],
                unit="msgs/s"))
    print(f"produce {res['produce_ratio']:.2f}x, consume {res['consume_ratio']:.2f}x of bare (goal >= 0.8)")
    return res


if __name__ == "__main__":
    run()
