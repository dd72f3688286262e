"""tests/milvus_real/test_milvus_oracle.py's checks on Milvus writing to pulsar-lite: what this project's
Spark source reads from the Pulsar topics equals what Milvus acknowledged and what ``query`` returns.

The checks that depend on the MQ run here: the batch read of the all-types collection against the acked
mutations and ``query``, schema inference, ``msgstream tail``/``inspect``, replay from the Pulsar
message ids Milvus keeps as channel checkpoints in etcd, and starting/ending timestamps (a publish-time
seek on Pulsar). Left to the Kafka run (CI time): binary vectors and VarChar keys (decoding, not the
MQ) and the AvailableNow restart (the mirror test here resumes a stream from its checkpoint). Not here:
a collection dropped and re-created while streaming — it gets other physical channels, and pulsar-lite
cannot list topics, so a query that names its channels (no ``channelPattern``) does not follow it.
"""

from __future__ import annotations

import pytest

from tests.milvus_real import test_milvus_oracle as oracle
from tests.milvus_real.test_milvus_oracle import (  # noqa: F401 - tests collected here
    test_batch_read_equals_what_milvus_acked_and_returns,
    test_replay_from_milvus_etcd_channel_checkpoints,
    test_schema_is_inferred_from_the_real_create_collection,
    test_tail_and_inspect_equal_what_milvus_acked,
    test_timestamps_at_milvus_mutation_results,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

coll = oracle.coll  # the module-scoped all-types collection, made here on this directory's Milvus


def test_milvus_wrote_to_pulsar_lite(milvus_stack, coll):
    """The stack is what it says: Milvus's DML channels are pulsar-lite topics holding the collection's
    inserts, read here by this project's Pulsar client straight from pulsar-lite (not through the shim)."""
    from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
    from msgstream_spark.msg.codec import msg_type_name, peek_msg_type

    assert milvus_stack.mq == "pulsar"
    broker = milvus_stack.env.extras["pulsar_lite"]
    assert milvus_stack.env.config.values["pulsar.address"] == broker.url
    kinds: dict[str, int] = {}
    with milvus_stack.env.client() as c:
        for ch in milvus_stack.dml_channels(coll.name):
            last = c.latest_message_id(ch)
            r = c.reader(ch)
            try:
                r.seek(PulsarMessageID.earliest())
                done = False
                while not done:
                    batch = r.receive_batch(1000, 10.0)
                    assert batch, f"{ch}: no message before its last one {last!r}"
                    for m in batch:
                        name = msg_type_name(peek_msg_type(m.payload, m.properties))
                        kinds[name] = kinds.get(name, 0) + 1
                        done = done or m.id.sort_key() >= last.sort_key()
            finally:
                r.close()
    assert kinds.get("Insert", 0) >= 2 and kinds.get("Delete", 0) >= 1 and kinds.get("TimeTick", 0) >= 1
    assert milvus_stack.env.extras["shim"].checksummed > 0  # Milvus's own consumers read through the shim
