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
    with pytest.raises(MirrorError, match=r"table format must be one of \('delta', 'iceberg', 'lance'\), got 'hudi'"):
        open_table("hudi", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    with pytest.raises(MirrorError, match="is no table of the formats"):
        registry.of(object())


def test_the_features_are_the_formats():
    assert registry.with_feature("history") == ["delta"]  # the change log is a Delta log beside a Delta mirror
    assert registry.with_feature("catalogs") == ["iceberg"]
    assert registry.with_feature("time_travel") == list(NAMES)


def test_a_formats_own_storage_keys_reach_its_library_and_not_obstore(s3):
    """The storage options a format's library reads itself (delta-rs's S3 log store keys: ``Format.storage_keys``,
    no longer a list in the store's settings) are accepted with object_store's, handed to the table library
    (``storage_options()``) and left out of obstore's config (which refuses a key it does not know)."""
    from msgstream_spark.mirror.store import open_store, resolve_options
    from msgstream_spark.mirror.store.settings import for_obstore

    own = {k for f in NAMES for k in registry.get(f).storage_keys.get("s3", ())}
    assert own, "a format with keys of its own (delta-rs's log store)"
    key = sorted(own)[0]
    opts = resolve_options("s3", {**s3.options(), key: "true"}, {})
    assert opts[key] == "true" and key not in for_obstore(opts)[0]
    st = open_store(s3.uri("t"), {**s3.options(), key: "true"}, env={})
    assert st.storage_options()[key] == "true"
    st.put(st.join("x"), b"1")  # obstore's client made without it
    assert st.read(st.join("x")) == b"1"


def test_the_change_log_and_the_default_format_come_from_the_registry(tmp_path):
    """The change history's log is the registry's choice (``change_log``), as is the format the demo creates
    (``default``): no module outside formats/ names one."""
    log = registry.change_log(str(tmp_path / "h"), "pk")
    assert not log.exists() and log.last_batch("q") is None
    log.ensure(pa.schema([pa.field("pk", pa.int64())]), "h")
    assert log.exists() and log.append([], "q", 3, {"k": "v"}) and not log.append([], "q", 3, {})
    assert log.last_batch("q") == 3 and log.to_arrow().num_rows == 0
    assert any(c.get("k") == "v" for c in log.commit_infos())
    assert registry.default() in NAMES
