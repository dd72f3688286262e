"""The format registry (#46): every format's table has every member of ``formats.base.MirrorTable`` (what a
caller may use), the registry finds a table's format, pins a version for a read, detects what a location holds and
refuses an unknown name naming the known ones."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.base import MirrorTable
from tests.mirror.changes import FIELDS, insert, to_arrow

NAMES = registry.names()


def _members(proto: type) -> set[str]:
    return {n for n in (*proto.__dict__, *proto.__annotations__) if not n.startswith("_")}


@pytest.mark.parametrize("fmt", NAMES)
def test_each_formats_table_has_every_member_callers_use(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    missing = sorted(m for m in _members(MirrorTable) if not hasattr(t, m))
    assert not missing, f"{fmt}'s table lacks {missing}"
    assert isinstance(t, MirrorTable) and registry.of(t).name == fmt


@pytest.mark.parametrize("fmt", NAMES)
def test_a_pinned_version_does_not_see_later_commits(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    assert apply_batch(t, to_arrow([insert(10, (1, "a"), (2, "b"))]), "pk", "q", 0)
    pinned = registry.pin(t)
    assert apply_batch(t, to_arrow([insert(20, (3, "c"))]), "pk", "q", 1)
    rows = pa.Table.from_batches(list(pinned.batches(["pk"])))
    assert sorted(rows.column("pk").to_pylist()) == [1, 2] and pinned.last_batch("q") == 0
    assert pinned.rows_of("pk", pa.array([2, 3]), ["pk", "v"]).to_pylist() == [{"pk": 2, "v": "b"}]
    assert registry.detect_at(str(tmp_path / "t")) == [fmt]


def test_an_unknown_format_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(MirrorError, match=r"table format must be one of \('delta', 'iceberg'\), got 'hudi'"):
        open_table("hudi", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    with pytest.raises(MirrorError, match="is no table of the formats"):
        registry.of(object())


def test_the_features_are_the_formats():
    assert registry.with_feature("history") == ["delta"]  # the change log is a Delta log beside a Delta mirror
    assert registry.with_feature("catalogs") == ["iceberg"]
    assert registry.with_feature("time_travel") == list(NAMES)
