"""The ``rows`` columns satisfy the contract of Spark's own CDC flow (``create_auto_cdc_flow`` with
keys = the pk, ``sequence_by`` = ``_seq``, ``apply_as_deletes`` = ``op = 'delete'``): Spark 4.3's AutoCDC
micro-batch validation accepts them and its SCD1 de-duplication gives the collection's state (an
independent model of Milvus's query). No MERGE-capable table format runs here (its jars cannot be
fetched): docs/mirror.md, "The Spark-native way"."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mirror import autocdc
from tests.mirror.changes import delete, insert, model, to_arrow, upsert

pytestmark = pytest.mark.slow  # Spark


def _workload(seed: int) -> list:
    rng = np.random.default_rng(seed)
    msgs = []
    for ts in range(1, 300):
        pks = [int(p) for p in rng.integers(0, 30, rng.integers(1, 4))]
        rows = [(p, f"v{ts}.{k}") for k, p in enumerate(pks)]
        kind = rng.integers(0, 3)
        up = list(reversed(upsert(ts, *rows)))  # as on Milvus 2.3.5's channel: the Insert first
        msgs += [insert(ts, *rows)] if kind == 0 else [delete(ts, *pks)] if kind == 1 else up
    return [msgs[i] for i in rng.permutation(len(msgs))]


def test_spark_auto_cdc_dedup_by_seq_gives_the_collection(spark):
    msgs = _workload(3) + [insert(400, (100, "first"), (100, "second")), *reversed(upsert(401, (101, "u")))]
    df = spark.createDataFrame(to_arrow(msgs))
    args = autocdc.change_args(spark, ["pk"], "_seq", "op = 'delete'")
    autocdc.validate(spark, df, args)
    out = autocdc.deduplicate(spark, df, args).collect()
    assert len({r.pk for r in out}) == len(out)
    state = {r.pk: (r.v, r._ts) for r in out if r.op == "insert"}
    assert state == model(msgs)
    assert state[100] == ("first", 400) and state[101] == ("u", 401)


def test_spark_auto_cdc_refuses_a_null_sequence(spark):
    from pyspark.sql import functions as F

    df = spark.createDataFrame(to_arrow([insert(1, (1, "a"))])).withColumn("_seq", F.lit(None).cast("decimal(38,0)"))
    with pytest.raises(Exception, match="NULL_SEQUENCE"):  # noqa: B017 - py4j wraps Spark's error
        autocdc.validate(spark, df, autocdc.change_args(spark, ["pk"], "_seq", "op = 'delete'"))


def _merge_recipe() -> str:
    """The ``MERGE`` in ``foreachBatch`` recipe of docs/mirror.md, up to the stream that runs it."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "mirror.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "MERGE INTO" in b)
    return block.split("(spark.readStream")[0]


def test_the_merge_recipe_drops_changes_at_or_before_the_snapshot(spark):
    """A key deleted before S is not in the snapshot; its older insert, replayed in a micro-batch before the
    delete's, must not reach the MERGE (``_seq`` cannot stop it: nothing in the table to compare with)."""
    from pyspark.errors import AnalysisException

    ns: dict = {"snapshot_ts": 100}
    exec(compile(_merge_recipe(), "docs/mirror.md", "exec"), ns)  # noqa: S102 - the documented recipe itself
    batch = spark.createDataFrame(to_arrow([insert(90, (2, "deleted at 95")), insert(100, (3, "at S")),
                                            insert(120, (1, "new"))]))
    with pytest.raises(AnalysisException):  # no MERGE-capable table here: the changes it would merge are the test
        ns["merge"](batch, 0)
    assert sorted((r.pk, r.v) for r in spark.table("changes").collect()) == [(1, "new")]
