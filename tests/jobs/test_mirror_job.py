"""The mirror job on the embedded log, with 2.6 WAL messages from the independent producer
(tests/wal26/producer.py): a field added by AlterCollection becomes a new nullable column."""

from __future__ import annotations

import pytest

from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow


def run_mirror(spark, cfg, ch, table, fmt="delta"):
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args([
        "--config", cfg, "--channels", ch, "--collection", "c26", "--table", str(table), "--table-format", fmt,
        "--snapshot", "never", "--progress-interval", "1"]), spark)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_field_added_by_alter_collection_becomes_a_nullable_column(spark, local_env, tmp_path, fmt):
    from msgstream_spark.mirror.table import open_table

    ch, tt, table = local_env.new_channel("mirror26"), D.TT, tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]), P.delete(tt + 2, [2]), P.timetick(tt + 3)])
        first = run_mirror(spark, cfg, ch, table, fmt)
        t = open_table(fmt, str(table), collection="c26", pk="pk", create=False)
        assert "note" not in t.schema.names
        assert [(r["pk"], r["vec"]) for r in t.to_arrow().to_pylist()] == [(1, [1.0, -1.0])]
        P.write(prod, [P.alter_collection(tt + 4, "note"), P.insert(tt + 5, [3]), P.timetick(tt + 6)])
        second = run_mirror(spark, cfg, ch, table, fmt)
    assert first["schema_restarts"] == second["schema_restarts"] == 0  # the restarted job infers the new schema
    t = open_table(fmt, str(table), collection="c26", pk="pk", create=False)
    assert t.schema.field("note").nullable
    got = sorted((r["pk"], r["vec"], r["note"], r["_ts"]) for r in t.to_arrow().to_pylist())
    assert got == [(1, [1.0, -1.0], None, tt + 1), (3, [3.0, -3.0], None, tt + 5)]
