"""What the driver of a many-collection job learns of a micro-batch before it writes: the batch's DDL rows and, per
collection its rows touch, a name, the database and the rows, read in one Spark job with no shuffle (each task
passes its DDL rows through and sums its own pieces per collection; the driver adds the tasks' sums). The rows
themselves never reach the driver: a task's answer is a row per collection it saw, plus the DDL.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from msgstream_spark.source.multi import KIND_ROWS


class _Facts:
    """A facts task's function (an instance of an importable class, not a closure: Spark pickles it at every batch,
    and a closure goes by value, its code and globals, the driver's modules scanned for each it refers to)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def facts(self, batches):
        schema = self.schema
        sums: dict[int, list] = {}  # collection id -> [name, db, rows]
        for b in batches:
            if not b.num_rows:
                continue
            is_rows = pc.fill_null(pc.equal(b.column("kind"), KIND_ROWS), False)
            ddl = b.filter(pc.invert(is_rows))
            if ddl.num_rows:
                yield ddl
            r = b.select(["_collection", "name", "db", "rows"]).filter(is_rows)
            cols = [r.column(c).to_pylist() for c in ("_collection", "name", "db", "rows")]
            for cid, name, db, n in zip(*cols):
                s = sums.setdefault(cid, ["", "", 0])
                s[0] = s[0] or name or ""
                s[1] = max(s[1], db or "")
                s[2] += n or 0
        if sums:
            ids = sorted(sums)
            given = {"kind": [KIND_ROWS] * len(ids), "_collection": ids, "name": [sums[c][0] for c in ids],
                     "db": [sums[c][1] for c in ids], "rows": [sums[c][2] for c in ids]}
            yield pa.RecordBatch.from_arrays([pa.array(given.get(f.name, [None] * len(ids)), f.type) for f in schema],
                                             schema=schema)

    __call__ = facts


def _facts_fn(schema: pa.Schema) -> _Facts:
    return _Facts(schema)


def batch_facts(df) -> tuple[list[Any], list[dict[str, Any]]]:
    """(the batch's DDL rows in stream order, one ``{"_collection", "name", "db", "n"}`` per collection its rows
    touch: a name its pieces carry (the first non-empty), the greatest database named ("" if none), its rows)."""
    from pyspark.sql import functions as F

    # a piece's payload (the rows themselves) is not needed here: it does not go to the Python tasks
    slim = df.withColumn("payload", F.when(F.col("kind") != KIND_ROWS, F.col("payload")))
    return facts_of(slim.mapInArrow(_facts_fn(to_arrow_schema(slim.schema, timezone="UTC")), slim.schema).collect())


def facts_of(got: list[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """:func:`batch_facts`'s answer from the facts tasks' rows (in partition order)."""
    ddl = [r for r in got if r["kind"] != KIND_ROWS]
    touched: dict[int, dict[str, Any]] = {}
    for r in got:
        if r["kind"] != KIND_ROWS:
            continue
        t = touched.setdefault(r["_collection"], {"_collection": r["_collection"], "name": "", "db": "", "n": 0})
        t["name"] = t["name"] or r["name"] or ""
        t["db"] = max(t["db"], r["db"] or "")
        t["n"] += int(r["rows"] or 0)
    return ddl, [touched[c] for c in sorted(touched)]
