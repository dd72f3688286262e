"""Several collections' schemas by one scan (``source.schema_many.infer_collections``, issue #44) answer what each
collection's own inference answers: on a long channel (the bounded scan, its newest messages first) a collection
whose CreateCollection lies behind more than 512 messages of others is looked for further back and its
CreateCollection's schema wins, while the others' come from their inserts in the newest window; a collection the
channel does not carry is left out. Real backend: the embedded log; real messages through the codec."""

from __future__ import annotations

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.source.options import parse_read_options
from msgstream_spark.source.schema import infer_collection
from msgstream_spark.source.schema_many import infer_collections
from tests.source.test_schema_lookback import BUSY, OTHER, WANTED, _insert, _write_busy
from tests.spark.helpers import MS, TS0, spark_options

THIRD = 6161


def _opts(env, ch, collection: str | None = None):
    return parse_read_options({**spark_options(env), "channels": ch, **({"collection": collection} if collection
                                                                        else {})}, streaming=False)


def test_one_scan_tells_each_collection_what_its_own_scan_tells(local_env):
    ch = _write_busy(local_env)  # WANTED's CreateCollection and inserts, then BUSY inserts of OTHER
    with local_env.client() as c, c.create_producer(ch) as prod:  # a third collection's inserts at the end
        msgs = [_insert(THIRD, "third", i, TS0 + (10 + BUSY + i) * MS) for i in range(5)]
        prod.send_batch([ProducerMessage(*codec.marshal(m), timestamp=m.end_ts) for m in msgs])
    got = infer_collections(_opts(local_env, ch), [ch], [WANTED, OTHER, THIRD, 9999])
    assert sorted(got) == [WANTED, OTHER, THIRD]  # 9999: not on the channel, left out (its own scan fails)
    for cid in (WANTED, OTHER, THIRD):
        own, _ = infer_collection(_opts(local_env, ch, str(cid)), [ch])
        assert got[cid] == own, cid
    assert got[WANTED].description == "the wanted collection"  # its CreateCollection's, found further back
