"""Seeks by time follow the messages' own Milvus timestamps, whatever the broker's clock says.

One table over every backend and four producers:

* ``library``: this project's producer (``msgstream_ts`` header/property, broker time = Milvus time);
* ``wire``: raw payloads as Milvus 2.3.5 writes them (no ``msg_type``, no ``msgstream_ts``, only a
  ``traceparent``), the broker's record time 30 ms after the hybrid ts's physical part (Milvus
  2.3.5 on Kafka was seen 14-61 ms late);
* ``zero``: a producer whose broker timestamps are (near) zero;
* ``behind``: a producer whose broker timestamps are three hours behind the messages' times.

Kafka record timestamps and the embedded log's time column are set directly; Pulsar's publish
time is the client's clock, so there the lie is in the ``msgstream_ts`` property (and the event
time) that our own producer would otherwise write.
"""

from __future__ import annotations

import pytest

from msgstream_spark.cli.main import main
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec, tso
from msgstream_spark.stream.timeseek import first_after, first_at_or_after, message_time
from tests.sink.helpers import config_file
from tests.spark.helpers import MS, spark_options

PRODUCERS = ["library", "wire", "zero", "behind"]
HOURS3_MS = 3 * 3600 * 1000
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def _messages(base: int) -> list[tuple[bytes, dict, int, list[tuple[str, int]]]]:
    """(payload, msg_type properties, ts, [(op, pk)]) — inserts, deletes and ticks, ts increasing.

    Steps of 5 ms plus a varying logical part, so several messages share a broker millisecond
    once the broker's clock is 30 ms late.
    """
    import numpy as np
    import pyarrow as pa

    from msgstream_spark.msg.columns import arrow_to_field_data
    from msgstream_spark.msg.schema import field_schema_from_arrow
    from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg

    out = []
    pk = 0
    for i in range(16):
        ts = base + i * 5 * MS + (i % 3)
        kind = i % 4
        if kind == 3:
            msg, rows = TimeTickMsg.build(ts), []
        elif kind == 2 and pk:
            msg = DeleteMsg.build(primary_keys=np.asarray([pk - 1], np.int64), timestamp=ts, collection_id=7,
                                  msg_id=i + 1, shard_name="x_7v0")
            rows = [("delete", pk - 1)]
        else:
            pks = np.arange(pk, pk + 2, dtype=np.int64)
            pk += 2
            fd = arrow_to_field_data(pa.array(pks), field_schema_from_arrow("pk", pa.int64(), field_id=100,
                                                                            is_primary_key=True))
            msg = InsertMsg.build(fields_data=[fd], num_rows=2, timestamp=ts, collection_id=7, partition_id=1,
                                  msg_id=i + 1, shard_name="x_7v0", collection_name="c")
            rows = [("insert", int(p)) for p in pks]
        payload, props = codec.marshal(msg)
        out.append((payload, props, ts, rows))
    return out


def _broker_ms(kind: str, ts: int) -> int:
    phys = tso.physical_ms(ts)
    return {"library": phys, "wire": phys + 30, "zero": 1, "behind": phys - HOURS3_MS}[kind]


def _publish(env, kind: str, channel: str, msgs) -> None:
    if kind == "library":
        with env.client() as c, c.create_producer(channel) as p:
            for payload, props, ts, _ in msgs:
                p.send(ProducerMessage(payload, props, timestamp=ts))
        return
    if env.name == "local":  # the embedded log's time column holds what the producer claims
        with env.client() as c, c.create_producer(channel) as p:
            for payload, _, ts, _ in msgs:
                p.send(ProducerMessage(payload, dict(TRACE), timestamp=_broker_ms(kind, ts) << 18))
    elif env.name == "kafka":
        _publish_kafka(env, kind, channel, msgs)
    else:
        _publish_pulsar(env, kind, channel, msgs)


def _publish_kafka(env, kind: str, channel: str, msgs) -> None:
    from confluent_kafka import Producer

    with env.client() as c:
        c.ensure_channel(channel)
    p = Producer({"bootstrap.servers": env.config.get_str("kafka.brokerlist")})
    for payload, _, ts, _ in msgs:
        headers = dict(TRACE)
        if kind == "behind":  # a producer that also writes a wrong msgstream_ts header
            headers["msgstream_ts"] = str(ts - (HOURS3_MS << 18))
        p.produce(channel, payload, partition=0, timestamp=_broker_ms(kind, ts), headers=headers)
        assert p.flush(15) == 0  # one record per batch (tansu counts batches)


def _publish_pulsar(env, kind: str, channel: str, msgs) -> None:
    import pulsar

    from msgstream_spark.mq.pulsar.settings import PulsarSettings

    s = PulsarSettings(env.config)
    client = pulsar.Client(s.service_url)
    try:
        p = client.create_producer(s.topic(channel), batching_enabled=False)
        for payload, _, ts, _ in msgs:
            props = dict(TRACE)
            kw = {}
            if kind in ("zero", "behind"):
                lie = 0 if kind == "zero" else ts - (HOURS3_MS << 18)
                props["msgstream_ts"] = str(lie)
                kw["event_timestamp"] = max(1, _broker_ms(kind, ts))
            p.send(payload, properties=props, **kw)
        p.close()
    finally:
        client.close()


@pytest.fixture(params=PRODUCERS)
def written(request, backend):
    """(env, channel, messages) of one producer kind on one backend."""
    kind = request.param
    ch = backend.new_channel(f"tseek-{kind}")
    msgs = _messages(tso.now())
    _publish(backend, kind, ch, msgs)
    return backend, ch, msgs


def _ids(client, ch, n) -> list:
    """The ids of the channel's ``n`` messages, in order."""
    r = client.reader(ch)
    try:
        r.seek(client.earliest_message_id(), inclusive=True)
        seen = []
        while len(seen) < n:
            batch = r.receive_batch(64, 5.0)
            assert batch, "channel stalled"
            seen += [m.id for m in batch]
        return seen
    finally:
        r.unsubscribe()


def _probes(msgs) -> list[int]:
    ts = [m[2] for m in msgs]
    return [ts[0] - 1, ts[0], ts[5], ts[5] + 1, ts[9] - 1, ts[-1], ts[-1] + 1]


def test_time_seeks_use_the_messages_times(written):
    env, ch, msgs = written
    ts = [m[2] for m in msgs]
    with env.client() as c:
        ids = _ids(c, ch, len(msgs)) + [None]
        for t in _probes(msgs):
            want = next((i for i, x in enumerate(ts) if x >= t), -1)
            assert first_at_or_after(c, ch, t) == ids[want], f"at or after {t}"
            want_after = next((i for i, x in enumerate(ts) if x > t), -1)
            assert first_after(c, ch, t) == ids[want_after], f"after {t}"


def test_message_time_is_the_payloads(written):
    env, ch, msgs = written
    with env.client() as c:
        r = c.reader(ch)
        try:
            r.seek(c.earliest_message_id(), inclusive=True)
            got = []
            while len(got) < len(msgs):
                batch = r.receive_batch(64, 5.0)
                assert batch
                got += [message_time(m.payload, m.properties) for m in batch]
        finally:
            r.unsubscribe()
    assert got == [m[2] for m in msgs]


def test_cli_tail_and_position_from_timestamp(written, tmp_path, capsys):
    import json

    env, ch, msgs = written
    cfg = config_file(env, tmp_path)
    ts = [m[2] for m in msgs]
    t = ts[6]
    assert main(["tail", "--config", cfg, "-c", ch, "--from-timestamp", str(t), "--timeout", "1"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [o["timestamp"] for o in out] == ts[6:]
    iso = tso.to_datetime(ts[8]).isoformat()  # millisecond precision: from the first message of that ms
    assert main(["tail", "--config", cfg, "-c", ch, "--from-timestamp", iso, "--timeout", "1"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [o["timestamp"] for o in out] == [x for x in ts if x >= tso.compose(tso.physical_ms(ts[8]))]
    assert main(["position", "--config", cfg, "-c", ch, "--at", str(ts[-1] + 1)]) == 0
    assert json.loads(capsys.readouterr().out)["empty"] is True
    assert main(["channels", "--config", cfg, "-c", ch, "--no-count"]) == 0
    assert json.loads(capsys.readouterr().out)["latest"]["timestamp"] == ts[-1]


@pytest.mark.slow
def test_spark_starting_and_ending_timestamp(spark, written):
    env, ch, msgs = written
    rows = [(op, pk, ts) for _, _, ts, rs in msgs for op, pk in rs]
    t = msgs[8][2]  # an insert's own ts: included by both bounds
    assert any(r[2] == t for r in rows)

    def read(**opts):
        df = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", ch)
              .options(**{k: str(v) for k, v in opts.items()}).load())
        return sorted((r.op, r.pk, r._ts) for r in df.select("op", "pk", "_ts").collect())

    assert read(endingTimestamp=t) == sorted(r for r in rows if r[2] <= t)
    assert read(startingTimestamp=t) == sorted(r for r in rows if r[2] >= t)
    assert read(startingTimestamp=msgs[2][2] + 1, endingTimestamp=msgs[12][2] - 1) == sorted(
        r for r in rows if msgs[2][2] < r[2] < msgs[12][2])
