"""A broker may redeliver what a consumer has not acknowledged yet (after a reconnect, or as pulsar-lite
sometimes does on its own). The consumer already handed those messages out: they must not come twice.

The redelivery is forced with the client's RedeliverUnacknowledgedMessages request on the suite's own
broker, which sends the unacknowledged messages again (pulsar-lite 0.2.0 ignores that request; it
redelivered an acknowledged message on its own once in CI, which is what this guards against)."""

from __future__ import annotations

import time

from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition


def test_redelivered_messages_are_not_handed_out_twice(pulsar_env):
    env = pulsar_env
    client = env.client()
    try:
        ch = env.new_channel()
        with client.create_producer(ch) as p:
            ids = p.send_batch([ProducerMessage(b"m%d" % i, {}) for i in range(6)])
        with client.subscribe(ch, "sub-redeliver", SubscriptionInitialPosition.EARLIEST) as c:
            first = []
            deadline = time.monotonic() + 30
            while len(first) < 3 and time.monotonic() < deadline:
                first += c.receive_batch(3 - len(first), 1.0)  # not acknowledged
            assert [m.payload for m in first] == [b"m0", b"m1", b"m2"]
            c._c.redeliver_unacknowledged_messages()  # the broker sends m0.. again
            rest = []
            deadline = time.monotonic() + 30
            while len(rest) < 3 and time.monotonic() < deadline:
                rest += c.receive_batch(3 - len(rest), 1.0)
            assert [m.payload for m in rest] == [b"m3", b"m4", b"m5"]
            assert [m.id for m in first + rest] == ids
            deadline = time.monotonic() + 30  # the redeliveries may still be on their way: all are dropped
            while c.redeliveries_dropped < 3 and time.monotonic() < deadline:
                assert c.receive(0.2) is None
            assert c.redeliveries_dropped >= 3  # m0..m2 (and what the client had prefetched)
            assert c.receive(0.5) is None
    finally:
        client.close()
