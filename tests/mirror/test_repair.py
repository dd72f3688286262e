"""Issue #38 item 2: ``mirror verify --repair`` makes the reported keys equal Milvus's rows whatever ``_seq`` the
wrong rows carry: one exactly-once commit deletes every live row of the keys by position and writes Milvus's rows.

Real Delta and Iceberg tables; the faults are commits of another writer through the table's own commit (as
tests/milvus_real/test_mirror_verify.py puts them), with ``_seq`` at, below and above the repair's. Milvus's side
is the :class:`~msgstream_spark.mirror.verify.milvus_side.MilvusSide` interface over rows held here, answering
as ``SdkMilvusSide.rows_of`` does (the table's schema, ``_ts`` = S, ``_seq`` = snapshot_seq(S), keys Milvus lacks
absent); the real Milvus 2.3.5 runs the same repair in tests/milvus_real/test_mirror_verify.py."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.formats.base import Plan
from msgstream_spark.mirror.order import snapshot_seq_array
from msgstream_spark.mirror.verify.compare import Result
from msgstream_spark.mirror.verify.run import REPAIR_QUERY, repair
from msgstream_spark.mirror.write.batch import lookup_local
from tests.mirror.changes import FIELDS, HeldMilvus, insert, table_state, to_arrow, vector

T, S = 1000 << 18, 2000 << 18  # the table's changes, the repair's S
AHEAD = snapshot_seq_array(S + (1000 << 18), 1)  # a _seq beyond any the log holds at S


class At:
    """``Log.newest_time``: the channels' newest Milvus time."""

    def newest_time(self, channels: list[str]) -> int:
        return S


def _tamper(t, rows: pa.Table, delete: list[int], batch: int) -> None:
    """Another writer's commit (query ``tamper``): the live rows of ``delete`` deleted, ``rows`` added as a file."""
    matches = lookup_local(t, pa.array(delete, pa.int64()))
    deletes = {}
    for path in pc.unique(matches.column("_file")).to_pylist():
        deletes[path] = matches.filter(pc.equal(matches.column("_file"), path)).column("_pos").to_numpy().astype("u8")
    path = os.path.join(t.write_spec().data_dir, f"tamper-{uuid.uuid4().hex}.parquet")
    pq.write_table(rows.cast(t.write_spec().schema), path)
    assert t.commit(Plan([path], deletes, rows.num_rows), query_id="tamper", batch_id=batch)


def _rows(t, *rows: tuple[int, str, object]) -> pa.Table:
    """Table rows (pk, v, ``_seq``) at time T, in the table's schema."""
    n = len(rows)
    seqs = [AHEAD[0].as_py() if q == "ahead" else q for _, _, q in rows]
    return pa.table({"pk": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows],
                     "fv": pa.array([vector(r[1]) for r in rows], pa.list_(pa.float32())),
                     "_ts": pa.array([T] * n, pa.int64()), "_seq": pa.array(seqs, AHEAD.type),
                     "_partition": pa.array([7] * n, pa.int64())}).select(t.schema.names).cast(t.schema)


def _seq_of(t, pk: int):
    return t.to_arrow().filter(pc.equal(t.to_arrow().column("pk"), pk)).column("_seq")[0].as_py()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_repair_wins_whatever_seq_the_wrong_rows_carry(fmt, tmp_path):
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    assert apply_batch(t, to_arrow([insert(T, *[(k, f"v{k}") for k in range(1, 8)])]), "pk", "q", 0)
    _tamper(t, _rows(t, (1, "same-seq", _seq_of(t, 1))), [1], 1)  # rewritten, its _seq kept
    _tamper(t, _rows(t, (2, "ahead", "ahead")), [2], 2)  # rewritten with a _seq beyond the repair's
    _tamper(t, _rows(t, (3, "dup-ahead", "ahead")), [], 3)  # a second row of key 3
    _tamper(t, _rows(t), [4], 4)  # deleted
    _tamper(t, _rows(t, (6, "ahead", "ahead"), (9, "extra", "ahead")), [6], 5)  # and key 9, which Milvus lacks
    milvus = HeldMilvus({k: f"v{k}" for k in range(1, 8)})
    problems = [{"kind": k, "pk": p} for k, p in [("stale", 1), ("stale", 2), ("duplicated", 3), ("missing", 4),
                                                  ("stale", 6), ("extra", 9)]]
    got = repair(t, milvus, At(), Result(problems, [], {}), ["ch0"])
    assert table_state(t.to_arrow()) == {**{k: (f"v{k}", S) for k in (1, 2, 3, 4, 6)}, 5: ("v5", T), 7: ("v7", T)}
    assert got == {"keys": 6, "deleted": 6, "written": 5, "S": S}  # rows of 1, 2, 3 (two), 6, 9; keys 1-4 and 6
    assert t.last_batch(REPAIR_QUERY) == 0
    again = repair(t, milvus, At(), Result(problems[:1], [], {}), ["ch0"])  # the next repair: its own batch id
    assert again["deleted"] == 1 and again["written"] == 1 and t.last_batch(REPAIR_QUERY) == 1
    assert table_state(t.to_arrow())[1] == ("v1", S)
