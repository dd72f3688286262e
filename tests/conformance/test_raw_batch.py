"""The bulk read path (``Consumer.receive_raw``) agrees with ``receive_batch`` on every backend."""

from __future__ import annotations

import time

from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition

WAIT = 20.0


def _drain_raw(consumer, n: int) -> list:
    """(payload, id, properties, timestamp, msg_type, offset) of exactly ``n`` messages via receive_raw."""
    out: list = []
    deadline = time.monotonic() + WAIT
    while len(out) < n and time.monotonic() < deadline:
        batch = consumer.receive_raw(n - len(out), 1.0)
        assert batch.channel == consumer.channel
        for i in range(len(batch)):
            off = batch.offsets[i] if batch.offsets is not None else None
            out.append((bytes(batch.payloads[i]), batch.id(i), dict(batch.properties(i)), batch.timestamp(i),
                        batch.msg_type(i), off))
    assert len(out) == n, f"got {len(out)} of {n} messages"
    return out


def test_receive_raw_matches_receive_batch(backend):
    client = backend.client()
    try:
        ch = backend.new_channel()
        sent = [ProducerMessage(f"p{i}".encode() * (i + 1), {"msg_type": "Insert", "i": str(i)}, timestamp=1000 + i)
                for i in range(30)] + [ProducerMessage(b"no-props")]
        with client.create_producer(ch) as p:
            ids = p.send_batch(sent)
        with client.reader(ch) as c:
            c.seek(client.earliest_message_id(), inclusive=True)
            raw = _drain_raw(c, len(sent))
        with client.reader(ch) as c:
            c.seek(client.earliest_message_id(), inclusive=True)
            msgs = []
            deadline = time.monotonic() + WAIT
            while len(msgs) < len(sent) and time.monotonic() < deadline:
                msgs += c.receive_batch(len(sent) - len(msgs), 1.0)
        assert [r[0] for r in raw] == [m.payload for m in sent] == [bytes(m.payload) for m in msgs]
        assert [r[1] for r in raw] == ids == [m.id for m in msgs]
        assert [r[2] for r in raw] == [dict(m.properties) for m in msgs]
        assert raw[4][2] == {"msg_type": "Insert", "i": "4"} and raw[-1][2] == {}
        assert [r[3] for r in raw] == [m.timestamp for m in msgs]
        assert [r[4] for r in raw] == ["Insert"] * 30 + [None]
        if raw[0][5] is not None:  # integer-offset backends: offsets are the ids' offsets
            assert [r[5] for r in raw] == [i.offset for i in ids]
    finally:
        client.close()


def test_receive_raw_times_out_empty(backend):
    client = backend.client()
    try:
        ch = backend.new_channel()
        with client.create_producer(ch) as p:
            p.send(ProducerMessage(b"x"))
        with client.subscribe(ch, "raw-empty", SubscriptionInitialPosition.LATEST) as c:
            batch = c.receive_raw(10, 0.5)
            assert len(batch) == 0 and batch.payloads == []
    finally:
        client.close()
