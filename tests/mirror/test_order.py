"""``_seq``: the change order of one pk (ts, then delete before insert, then message rank, then row)."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from msgstream_spark.errors import MirrorError, MsgStreamError
from msgstream_spark.mirror.order import (
    MAX_ROW,
    SEQ_TYPE,
    seq_array,
    seq_parts,
    seq_value,
    snapshot_seq,
    snapshot_seq_array,
)

# a hybrid timestamp of 2026 (physical ms << 18 | logical)
TS = (1_795_000_000_000 << 18) | 5


def test_seq_array_equals_the_documented_formula():
    ts = np.array([TS, TS, TS + 1, 0], dtype=np.uint64)
    got = seq_array(ts, np.array([False, True, True, False]), np.array([3, 0, 7, 0]), 2).to_pylist()
    want = [t * 2**64 + op * 2**63 + (2**31 - 1 - 2) * 2**32 + (2**32 - 2 - row) for t, op, row in
            [(TS, 0, 3), (TS, 1, 0), (TS + 1, 1, 7), (0, 0, 0)]]
    assert got == [decimal.Decimal(w) for w in want]
    assert seq_array(ts, "insert").type == SEQ_TYPE == pa.decimal128(38, 0)


def test_seq_array_of_one_message_equals_seq_value_per_row():
    """One op and one message rank for every row (a read's message): the same values as row by row."""
    ts = np.array([TS, TS + 1, TS + 1, 0], dtype=np.uint64)
    for op in ("insert", "delete"):
        for rows in (None, np.array([5, 0, MAX_ROW - 1, 2])):
            got = seq_array(ts, op, rows, 3).to_pylist()
            idx = range(4) if rows is None else rows
            assert got == [decimal.Decimal(seq_value(int(t), op, int(r), 3)) for t, r in zip(ts, idx)]
    with pytest.raises(MirrorError, match="message rank 2147483648"):
        seq_array(ts, "insert", None, 2**31)


def test_order_ts_then_delete_before_insert_then_the_first_row_last():
    d = seq_value(TS, "delete", row=0, message=0)
    first, second = seq_value(TS, "insert", row=0), seq_value(TS, "insert", row=1)
    later_delete = seq_value(TS + 1, "delete", row=MAX_ROW - 1, message=(1 << 31) - 1)
    assert d < second < first < later_delete  # Milvus's query returns the first of a repeated pk
    assert seq_value(TS, "insert", row=0, message=1) < first
    assert seq_parts(second) == (TS, "insert", 0, 1) and seq_parts(d) == (TS, "delete", 0, 0)


def test_snapshot_seq_after_every_change_at_s_before_any_later():
    s = snapshot_seq(TS)
    assert seq_value(TS, "insert", row=0, message=0) < s < seq_value(TS + 1, "delete", row=MAX_ROW - 1)
    assert seq_value(TS, "delete") < s
    assert snapshot_seq_array(TS, 3).to_pylist() == [decimal.Decimal(s)] * 3


def test_seq_sorts_in_pyarrow_like_the_ints():
    rng = np.random.default_rng(7)
    ts = rng.integers(TS - 1000, TS + 1000, 500).astype(np.uint64)
    ops = rng.integers(0, 2, 500).astype(bool)
    rows = rng.integers(0, MAX_ROW - 1, 500).astype(np.uint64)
    arr = seq_array(ts, ops, rows)
    ints = [seq_value(int(t), "insert" if o else "delete", int(r)) for t, o, r in zip(ts, ops, rows)]
    assert pc.sort_indices(arr).to_pylist() == sorted(range(500), key=lambda i: ints[i])


def test_out_of_range_is_a_clear_error():
    with pytest.raises(MirrorError, match="outside what _seq can hold"):
        seq_value(10**38, "insert")
    with pytest.raises(MirrorError, match="beyond what _seq can hold"):
        seq_array(np.array([2**63], dtype=np.uint64), "insert")
    with pytest.raises(MirrorError, match="row index 4294967295"):
        seq_array(np.array([TS], dtype=np.uint64), "insert", np.array([MAX_ROW]))
    with pytest.raises(MsgStreamError, match="op must be 'insert' or 'delete'"):
        seq_value(TS, "upsert")
