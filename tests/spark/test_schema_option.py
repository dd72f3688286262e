"""Regression found by the chaos suite (issue 12): a ``schema`` option that names the columns the source
adds itself (``op``, ``_ts``, ...) no longer repeats them (Spark then failed with an Arrow IndexOutOfBounds)."""

from __future__ import annotations

from msgstream_spark.source.rows import rows_schema_ddl
from msgstream_spark.spark.datasource import MsgStreamDataSource


def _names(ddl: str) -> list[str]:
    from msgstream_spark.source.rows import _ddl_columns

    return [c.split()[0].strip("`") for c in _ddl_columns(ddl)]


def test_columns_the_source_adds_are_not_repeated(tmp_path):
    ds = MsgStreamDataSource({"mq.type": "local", "local.path": str(tmp_path / "log.db"), "channels": "a",
                              "schema": "op string, pk bigint, vec array<float>, m map<bigint, float>, _ts bigint"})
    names = _names(ds.schema())
    assert names[:4] == ["op", "pk", "vec", "m"] and len(names) == len(set(names))
    assert names.count("_ts") == 1


def test_plain_field_lists_are_unchanged():
    assert _names(rows_schema_ddl("pk bigint, `name` string"))[:3] == ["op", "pk", "name"]
    assert _names(rows_schema_ddl(""))[0] == "op"
