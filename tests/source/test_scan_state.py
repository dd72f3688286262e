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
