"""Schema inference resumes where the last scan of the same channels stopped (``source/scancache.py``):
the backend keeps the scan's state, a later plan reads only what was appended, and what it reads there
(an AlterCollection, another collection) still counts as in one scan from the start. Every backend;
2.6 data from the independent test producer (tests/wal26/producer.py)."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.source import scancache
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P


def _infer(env, ch, **options):
    opts = parse_read_options({**spark_options(env), "channels": ch, **options}, streaming=False)
    return infer_collection(opts, [ch])


def _fields(schema) -> list[str]:
    return [f.name for f in schema.fields]


def test_a_later_plan_reads_only_what_was_appended_and_still_finds_changes(backend):
    ch = backend.new_channel("scanstate")
    with backend.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [*P.broadcast(P.create_collection, D.TT, 5, [P.CONTROL_VCHANNEL, D.VC]), P.insert(D.TT + 2, [1]),
                       P.timetick(D.TT + 3)])
    schema, cid = _infer(backend, ch)
    assert cid == P.COLLECTION and "note" not in _fields(schema)
    with backend.client() as c:
        stored = scancache.load(c, scancache.state_key(None, [ch]))
        assert c.bytes_to_message_id(stored.upto[ch]) == c.latest_message_id(ch)  # scanned to the end, kept
        assert set(stored.found) == {P.COLLECTION}
        with c.create_producer(ch) as prod:  # appended after the first plan
            P.write(prod, [P.alter_collection(D.TT + 4, "note"), P.timetick(D.TT + 5)])
    schema, cid = _infer(backend, ch)
    assert cid == P.COLLECTION and "note" in _fields(schema)  # a new query infers the altered schema
    with backend.client() as c, c.create_producer(ch) as prod:  # a 2.5 insert of another collection
        prod.send_batch([ProducerMessage(P.insert_body([8], D.TT + 7, collection=555), {"msg_type": "Insert"},
                                         D.TT + 7)])
    with pytest.raises(SchemaError, match="several collections"):
        _infer(backend, ch)  # the stored notes (444) and the appended insert (555) together
    schema, cid = _infer(backend, ch, collection=str(P.COLLECTION))  # another key: a scan of its own
    assert cid == P.COLLECTION and "note" in _fields(schema)


def _inserts_25(n: int, collection: int = P.COLLECTION, first: int = 0) -> list[ProducerMessage]:
    return [ProducerMessage(P.insert_body([i], D.TT + i, collection=collection), {"msg_type": "Insert"}, D.TT + i)
            for i in range(first, first + n)]


def test_a_scan_for_a_collection_id_is_kept_to_the_channels_end(local_env):
    """With option ``collection`` an id, the scan of a 2.5 channel stops once it has found the collection: the
    stored state must then say the channel was read up to its latest message, not up to where the scan stopped
    (else every later plan fetched on from there, a reader and a fetch per channel, until it caught up)."""
    ch = local_env.new_channel("scanid")
    with local_env.client() as c, c.create_producer(ch) as prod:
        prod.send_batch(_inserts_25(1500))  # more than one receive_batch (1024) of the unbounded scan
    for _ in range(2):
        schema, cid = _infer(local_env, ch, collection=str(P.COLLECTION), schemaScanMessages="0")
        assert cid == P.COLLECTION and _fields(schema)[:2] == ["pk", "vec"]
        with local_env.client() as c:
            stored = scancache.load(c, scancache.state_key(str(P.COLLECTION), [ch]))
            assert c.bytes_to_message_id(stored.upto[ch]) == c.latest_message_id(ch)
    with local_env.client() as c, c.create_producer(ch) as prod:  # appended: read from the kept end on
        prod.send_batch(_inserts_25(3, collection=555, first=1500))
    schema, cid = _infer(local_env, ch, collection=str(P.COLLECTION), schemaScanMessages="0")
    assert cid == P.COLLECTION
    with local_env.client() as c:
        stored = scancache.load(c, scancache.state_key(str(P.COLLECTION), [ch]))
        assert c.bytes_to_message_id(stored.upto[ch]) == c.latest_message_id(ch)


def test_a_scan_for_a_collection_name_reads_on_to_the_newest_id_of_that_name(local_env):
    """A name can be re-used by a re-created collection (a new id): the scan does not stop at the first id it
    finds, so the newest id of the name wins in the first plan, and the state is kept to the channel's end."""
    ch = local_env.new_channel("scanname")
    with local_env.client() as c, c.create_producer(ch) as prod:
        prod.send_batch(_inserts_25(1500) + _inserts_25(2, collection=P.COLLECTION + 1, first=1500))
    _schema, cid = _infer(local_env, ch, collection="c26", schemaScanMessages="0")
    assert cid == P.COLLECTION + 1
    with local_env.client() as c:
        stored = scancache.load(c, scancache.state_key("c26", [ch]))
        assert c.bytes_to_message_id(stored.upto[ch]) == c.latest_message_id(ch)


def test_a_scan_for_a_collection_id_reads_on_when_26_messages_follow(local_env):
    """The channel's last message is a 2.6 one (an AlterCollection here): the early stop keeps where it stopped,
    so the next plan reads on and the altered schema wins."""
    ch = local_env.new_channel("scanid26")
    with local_env.client() as c, c.create_producer(ch) as prod:
        prod.send_batch(_inserts_25(1500))
        P.write(prod, [P.alter_collection(D.TT + 2000, "note"), P.timetick(D.TT + 2001)])
    key = scancache.state_key(str(P.COLLECTION), [ch])
    schema, cid = _infer(local_env, ch, collection=str(P.COLLECTION), schemaScanMessages="0")
    assert cid == P.COLLECTION and "note" not in _fields(schema)  # stopped inside the 2.5 inserts
    with local_env.client() as c:
        assert c.bytes_to_message_id(scancache.load(c, key).upto[ch]) < c.latest_message_id(ch)
    schema, cid = _infer(local_env, ch, collection=str(P.COLLECTION), schemaScanMessages="0")
    assert cid == P.COLLECTION and "note" in _fields(schema)
    with local_env.client() as c:
        assert c.bytes_to_message_id(scancache.load(c, key).upto[ch]) == c.latest_message_id(ch)
