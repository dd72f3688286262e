"""The change log (issue #29 part 3): an upsert is one update, an insert of a present key an update, a delete
of an absent key no change; "as of T" and the SCD2 columns computed from the log."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.history.table import HistoryTable, as_of, history_rows, scd2
from msgstream_spark.mirror.order import SEQ_TYPE, seq_value

S = 1 << 40  # Milvus times: one second is 1000 << 18


def _changes(rows: list[tuple[str, int, int, str | None]]) -> pa.Table:
    """(op, pk, ts, value) in arrival order; the row index inside a message is 0."""
    return pa.table({"op": [r[0] for r in rows], "pk": pa.array([r[1] for r in rows], pa.int64()),
                     "v": [r[3] for r in rows], "_ts": pa.array([r[2] for r in rows], pa.int64()),
                     "_seq": pa.array([seq_value(r[2], r[0]) for r in rows], SEQ_TYPE),
                     "_partition": pa.array([7] * len(rows), pa.int64()),
                     "_channel": ["c"] * len(rows)})


def _existed(pks: list[int], ts: int = S) -> pa.Table:
    return pa.table({"pk": pa.array(pks, pa.int64()), "_ts": pa.array([ts] * len(pks), pa.int64())})


def test_the_delete_half_of_an_upsert_applied_in_an_earlier_batch_changes_nothing():
    later = _changes([("delete", 1, S + 10, None), ("insert", 1, S + 20, "1c"), ("delete", 6, S + 10, None)])
    out = history_rows(later, "pk", pa.table({"pk": pa.array([1, 6], pa.int64()),
                                              "_ts": pa.array([S + 10, S + 5], pa.int64())}))
    assert [(r["op"], r["pk"], r["_ts"]) for r in out.to_pylist()] == [("update", 1, S + 20), ("delete", 6, S + 10)]


def test_an_upsert_is_one_update_and_absent_keys_change_nothing():
    ch = _changes([
        ("insert", 1, S + 10, "1b"), ("delete", 1, S + 10, None),   # 2.3.5's upsert: Insert then Delete, one ts
        ("insert", 2, S + 10, "2a"), ("delete", 2, S + 20, None),   # a new key, then deleted
        ("delete", 3, S + 10, None),                                # a key nobody has
        ("insert", 4, S + 30, "4a"), ("delete", 4, S + 30, None),   # an upsert of a new key
        ("insert", 5, S + 10, "5b"),                                # an insert of a present key
    ])
    out = history_rows(ch, "pk", _existed([1, 5]))
    got = [(r["op"], r["pk"], r["_ts"], r["v"]) for r in out.to_pylist()]
    assert got == [("update", 1, S + 10, "1b"), ("insert", 2, S + 10, "2a"), ("delete", 2, S + 20, None),
                   ("insert", 4, S + 30, "4a"), ("update", 5, S + 10, "5b")]
    assert "_channel" not in out.column_names and out.column("_time").type == pa.timestamp("us", tz="UTC")  # Delta: µs


def test_as_of_and_scd2_from_the_log(tmp_path):
    h = HistoryTable(str(tmp_path / "h"), "pk")
    seed = _changes([("insert", 1, S, "1a"), ("insert", 2, S, "2a")]).drop_columns(["op", "_channel"])
    assert h.seed(lambda: seed) and not h.seed(lambda: seed)
    first = _changes([("insert", 1, S + 10, "1b"), ("delete", 1, S + 10, None), ("insert", 3, S + 10, "3a")])
    assert h.append(first, _existed([1, 2]), "q", 0)
    assert not h.append(first, _existed([1, 2]), "q", 0)  # exactly once per batch
    h.append(_changes([("delete", 2, S + 20, None)]), _existed([2]), "q", 1)

    def at(ts):
        return sorted((r["pk"], r["v"]) for r in as_of(h, ts).to_pylist())

    assert at(S) == [(1, "1a"), (2, "2a")]
    assert at(S + 10) == [(1, "1b"), (2, "2a"), (3, "3a")]
    assert at(S + 20) == [(1, "1b"), (3, "3a")]
    with pytest.raises(MirrorError, match="begins at"):
        as_of(h, S - 1)
    log = h.to_arrow()
    assert [r["op"] for r in log.to_pylist()].count("update") == 1
    versions = sorted((r["pk"], r["v"], r["_valid_to"] is None, r["_is_current"]) for r in scd2(log, "pk").to_pylist())
    assert versions == [(1, "1a", False, False), (1, "1b", True, True), (2, "2a", False, False),
                        (3, "3a", True, True)]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_pinned_reads_a_version_and_the_recorded_watermark(tmp_path, fmt):
    import json

    from msgstream_spark.mirror.apply import apply_batch
    from msgstream_spark.mirror.table import open_table
    from msgstream_spark.mirror.verify.pinned import PinnedTable, table_identity
    from msgstream_spark.mirror.watermark import PROP_WATERMARK, table_watermark

    ch = _changes([("insert", 1, S + 10, "a"), ("insert", 2, S + 10, "b")])
    fields = ch.drop_columns(["op", "_channel", "_ts", "_seq", "_partition"]).schema
    t = open_table(fmt, str(tmp_path / "t"), collection="c", pk="pk", arrow_schema=fields)
    wm = {"ch0": {"msgID": "AQ==", "ts": S + 11}}
    assert apply_batch(t, ch, "pk", "q", 0, commit_info={PROP_WATERMARK: json.dumps(wm)})
    pinned = PinnedTable(t)
    apply_batch(t, _changes([("delete", 1, S + 20, None)]), "pk", "q", 1)  # after the pin: not seen
    assert pinned.committed_by == ("q", 0) and pinned.last_batch("q") == 0
    got = table_watermark(t.properties(), pinned.recorded_watermark, 0, "q", None)
    assert got.source == "commit" and got.offset == wm and got.ts == S + 11
    assert sorted(r["pk"] for b in pinned.batches() for r in b.to_pylist()) == [1, 2]
    assert pinned.rows_of("pk", pa.array([1, 3], pa.int64()), ["pk", "_ts"]).to_pylist() == [{"pk": 1, "_ts": S + 10}]
    assert table_identity(fmt, str(tmp_path / "t")) == ("c", "pk")


def test_a_task_decides_a_key_whose_changes_two_chunks_split(tmp_path):
    """A task's share arrives chunk by chunk in (key, _seq) order: the rows of a chunk's last key wait for the
    next chunk, so an upsert cut by a chunk boundary is still one ``update``."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.history.write import HistorySpec, HistoryWriter, change_fields, history_schema

    ch = _changes([("delete", 1, S + 10, None), ("insert", 1, S + 10, "1b"), ("delete", 2, S + 10, None),
                   ("insert", 2, S + 10, "2b"), ("insert", 3, S + 10, "3a")])  # sorted by key and _seq
    spec = HistorySpec(history_schema(change_fields(ch.schema)), "pk", str(tmp_path / "data"))
    w = HistoryWriter(spec, _existed([1, 2]))
    for i in (0, 1, 3, 4):  # chunks [d1] [i1 d2] [i2] [i3]
        w.add(ch.slice(i, {0: 1, 1: 2, 3: 1, 4: 1}[i]))
    files = w.close()
    rows = pq.read_table(files.column("_file")[0].as_py())
    assert files.column("_rows").to_pylist() == [3]
    assert [(r["op"], r["pk"], r["v"]) for r in rows.to_pylist()] == [("update", 1, "1b"), ("update", 2, "2b"),
                                                                    ("insert", 3, "3a")]
