"""A first schema scan of a long channel reads only its newest messages (``source/tailscan.py``, issue #24):
the messages fetched are counted at the real backend's consumer, never timed. The budget is made small
here (a window of 10, option schemaScanMessages=40) so that a log of ~130 messages is a long one. Data: the
independent 2.6 test producer (tests/wal26/producer.py), on the embedded log, Kafka, the suite's Pulsar broker
and pulsar-lite (Pulsar: one window, the newest entries of the last message's ledger)."""

from __future__ import annotations

import pytest

from msgstream_spark.source import scancache, tailscan
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import _scan_schemas, infer_collection
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P

WINDOW, BUDGET = 10, 40
METADATA = "__msgstream_metadata"


@pytest.fixture(params=["local", "kafka", "pulsar", "pulsar-lite"])
def env(request):
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_env")


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(tailscan, "TAIL_WINDOW", WINDOW)


@pytest.fixture
def fetched(env, monkeypatch):
    """A list whose length is the number of the channels' messages the backend's consumers handed out."""
    got: list = []
    with env.client() as c:
        probe = c.reader(env.new_channel("probe"))
        cls = type(probe)
        probe.unsubscribe()
    real = cls.receive_batch

    def counting(self, *a, **kw):
        batch = real(self, *a, **kw)
        got.extend(m for m in batch if m.channel != METADATA)  # Pulsar keeps the stored scan state in a topic
        return batch

    monkeypatch.setattr(cls, "receive_batch", counting)
    return got


def _opts(env, ch, **extra):
    return parse_read_options({**spark_options(env), "channels": ch, "schemaScanMessages": str(BUDGET), **extra},
                              streaming=False)


def _write(env, msgs) -> str:
    ch = env.new_channel("tail")
    with env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, msgs)
    return ch


def _forget(env, ch) -> None:
    with env.client() as c:
        c.put_metadata(scancache.state_key(None, [ch]), "")


def _inserts(tt: int, n: int) -> list:
    return [m for i in range(n) for m in (P.insert(tt + 2 * i, [i]), P.timetick(tt + 2 * i + 1))]


def _names(schema) -> list[str]:
    return [f.name for f in schema.fields]


def test_a_first_plan_reads_the_newest_messages_and_finds_a_later_alter(env, small_budget, fetched):
    log = [*P.broadcast(P.create_collection, D.TT, 5, [P.CONTROL_VCHANNEL, D.VC]), *_inserts(D.TT + 10, 50),
           P.alter_collection(D.TT + 200, "note"), *_inserts(D.TT + 210, 10)]
    ch = _write(env, log)
    schema, cid = infer_collection(_opts(env, ch), [ch])
    assert cid == P.COLLECTION and "note" in _names(schema)
    assert 0 < len(fetched) <= BUDGET < len(log)  # the alter lies in the newest 30 messages
    _forget(env, ch)
    fetched.clear()
    full, full_cid = infer_collection(_opts(env, ch, schemaScanMessages="0"), [ch])  # from the first message
    assert len(fetched) >= len(log)
    assert (full, full_cid) == (schema, cid)


def test_a_create_beyond_the_budget_leaves_the_newest_inserts(env, small_budget, fetched):
    ch = _write(env, [*P.broadcast(P.create_collection, D.TT, 5, [P.CONTROL_VCHANNEL, D.VC]),
                      *_inserts(D.TT + 10, 60)])
    found, _ = _scan_schemas(_opts(env, ch), [ch])
    assert len(fetched) <= BUDGET
    (cid, (schema, source)), = found.items()
    assert (cid, source) == (P.COLLECTION, "Insert")  # the create lies before the budget
    assert _names(schema) == _names(P.collection_schema())
    with env.client() as c, c.create_producer(ch) as prod:  # appended later: the next plan reads it alone
        P.write(prod, [P.alter_collection(D.TT + 300, "note")])
    fetched.clear()
    schema, cid = infer_collection(_opts(env, ch), [ch])
    assert cid == P.COLLECTION and "note" in _names(schema) and len(fetched) <= 2


def test_a_short_channel_is_read_from_its_first_message(env, small_budget, fetched):
    ch = _write(env, [*P.broadcast(P.create_collection, D.TT, 5, [P.CONTROL_VCHANNEL, D.VC]),
                      *_inserts(D.TT + 10, 15)])
    found, _ = _scan_schemas(_opts(env, ch), [ch])
    assert found[P.COLLECTION][1] == "CreateCollection" and len(fetched) == 32


def test_the_budget_option_is_checked(local_env):
    from msgstream_spark.errors import OptionError

    ch = local_env.new_channel("tail")
    assert _opts(local_env, ch, schemaScanMessages="0").schema_scan_messages == 0
    assert parse_read_options({**spark_options(local_env), "channels": ch}, streaming=False).schema_scan_messages \
        == 512
    with pytest.raises(OptionError, match="schemaScanMessages must be an integer >= 0"):
        _opts(local_env, ch, schemaScanMessages="-3")


def test_a_pulsar_window_stays_inside_the_last_messages_ledger(pulsar_lite_env):
    from msgstream_spark.mq.pulsar.message_id import PulsarMessageID as Id

    with pulsar_lite_env.client() as c:
        assert c.id_before(Id(7, 100), 40) == Id(7, 61)  # entries 61..100: the newest 40
        assert c.id_before(Id(7, 39), 40) is None  # a ledger of 40 entries: earlier ones are in another ledger
        assert c.id_before(Id(7, 100), 0) is None
