"""Source option ``upsertAs=update`` (issue #29): an upsert (an insert and a delete of a key at one timestamp)
reads as one ``update`` row; the default keeps the two rows. Messages from the independent 2.6 producer on a
real embedded log, one row per Arrow batch so that a pair is split by the task's own batching."""

from __future__ import annotations

import pytest

from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P


@pytest.mark.parametrize("batch_rows", ["1", "8192"])
def test_an_upsert_is_one_update_row(local_env, tmp_path, batch_rows):
    from msgstream_spark.source import read_table

    ch, tt = local_env.new_channel("upsert_as"), D.TT
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]),
                       P.insert(tt + 2, [1]), P.delete(tt + 2, [1]),  # an upsert of 1 (Insert first, as 2.3.5)
                       P.delete(tt + 3, [2]), P.timetick(tt + 4)])
    cfg = config_file(local_env, tmp_path)

    def rows(**opts):
        t = read_table(cfg, ch, collection="c26", maxBatchRows=batch_rows, **opts)
        return [(r["op"], r["pk"], r["_ts"] - tt) for r in t.to_pylist()]

    assert rows(upsertAs="update") == [("insert", 1, 1), ("insert", 2, 1), ("update", 1, 2), ("delete", 2, 3)]
    assert rows() == [("insert", 1, 1), ("insert", 2, 1), ("insert", 1, 2), ("delete", 1, 2), ("delete", 2, 3)]
    with pytest.raises(Exception, match="upsertas"):
        rows(upsertAs="merge")
