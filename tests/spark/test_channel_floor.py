"""A storage snapshot's table in the database job takes each channel's rows after that channel's own checkpoint
(``spark.channel_floor``): a row at or before its channel's floor is left out, later ones, rows of other channels
and rows of no channel (a DropPartition's deletes) stay."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_rows_at_or_before_their_channel_s_floor_are_left_out(spark):
    from msgstream_spark.spark.channel_floor import floored

    rows = [("c0", 41, 1), ("c0", 50, 2), ("c1", 50, 3), ("c1", 55, 4), ("c1", 56, 5), (None, 10, 6), ("c2", 1, 7)]
    df = spark.createDataFrame(rows, "_channel string, _ts long, pk long")
    kept = sorted(r["pk"] for r in floored(df, {"c1": 55}).collect())
    assert kept == [1, 2, 5, 6, 7]
    assert floored(df, {}) is df
