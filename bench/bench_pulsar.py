"""Pulsar backend throughput against a bare pulsar-client loop, same payloads, same broker, same run.

Starts the test suite's broker in a child process (so it does not share this interpreter's
lock), or uses MSGSTREAM_TEST_PULSAR (e.g. the compose service). Both sides use ZSTD,
batching off and the same pipelining (send_async, then wait for every receipt); both consumers
read the payload, properties, id (ledger, entry, batch index) and publish time of every message
and acknowledge it.
Goal: >= 0.8 of bare, at 1 KiB and at 64 KiB payloads.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

from bench._util import broker_comparison
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.pulsar.client import PulsarClient

BATCH = 1000


def _bare(url: str, payloads: list[bytes]) -> tuple[float, float]:
    import pulsar

    client = pulsar.Client(url, operation_timeout_seconds=30)
    topic = f"persistent://public/default/bare-{uuid.uuid4().hex[:8]}"
    cons = client.subscribe(topic, "bare", initial_position=pulsar.InitialPosition.Earliest)
    p = client.create_producer(topic, batching_enabled=False, compression_type=pulsar.CompressionType.ZSTD,
                               max_pending_messages=10000)
    t0 = time.perf_counter()
    for s in range(0, len(payloads), BATCH):
        done = threading.Semaphore(0)
        chunk = payloads[s:s + BATCH]
        for x in chunk:
            p.send_async(x, lambda res, mid, done=done: done.release(), properties={"msg_type": "Insert"})
        for _ in chunk:
            done.acquire(timeout=60)
    t_prod = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(len(payloads)):
        m = cons.receive(5000)
        # what a consumer that keeps positions reads: payload, properties, id and publish time
        mid = m.message_id()
        m.data(), m.properties(), mid.ledger_id(), mid.entry_id(), mid.batch_index(), m.publish_timestamp()
        cons.acknowledge(m)
    t_cons = time.perf_counter() - t0
    cons.close()
    p.close()
    client.close()
    return t_prod, t_cons


def _ours(url: str, web_port: int, payloads: list[bytes]) -> tuple[float, float]:
    client = PulsarClient(Config.from_dict({"mq": {"type": "pulsar"},
                                            "pulsar": {"address": url, "webport": web_port}}))
    ch = f"ours-{uuid.uuid4().hex[:8]}"
    cons = client.subscribe(ch, ch, SubscriptionInitialPosition.EARLIEST)
    prod = client.create_producer(ch)
    msgs = [ProducerMessage(x, {"msg_type": "Insert"}) for x in payloads]
    t0 = time.perf_counter()
    for s in range(0, len(msgs), BATCH):
        prod.send_batch(msgs[s:s + BATCH])
    t_prod = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = 0
    while n < len(msgs):
        got = cons.receive_batch(1024, 5.0)
        if not got:
            break
        for m in got:
            cons.ack(m)
        n += len(got)
    t_cons = time.perf_counter() - t0
    cons.close()
    prod.close()
    client.close()
    return t_prod, t_cons


def run() -> dict:
    external = os.environ.get("MSGSTREAM_TEST_PULSAR")
    with contextlib.ExitStack() as stack:
        if external:
            url, web = external, int(os.environ.get("MSGSTREAM_TEST_PULSAR_WEBPORT", "8080"))
        else:
            from tests.pulsar_broker.server import BrokerProcess

            broker = stack.enter_context(BrokerProcess())
            url, web = broker.url, broker.web_port
        _bare(url, [b"w" * 1024] * 2000)  # warm up
        return broker_comparison("pulsar-client", lambda p: _bare(url, p), lambda p: _ours(url, web, p))


if __name__ == "__main__":
    run()
