"""The change order of one primary key, as Milvus applies it: the ``_seq`` column of ``rows`` output.

``_seq`` is a ``decimal(38,0)`` built from four parts, most significant first::

    _seq = _ts * 2**64  +  op * 2**63  +  (2**31 - 1 - message) * 2**32  +  (2**32 - 2 - row)

- ``_ts``: the row's hybrid timestamp (Milvus orders every change by it);
- ``op``: 0 for a delete, 1 for an insert. At one timestamp Milvus's delete does not remove an insert
  (a delete at T hides rows written before T), which is how an upsert (on Milvus 2.3.5's channel an
  Insert message *followed* by a Delete message with the same timestamp) leaves the new row: the delete
  sorts first, whatever the arrival order;
- ``message``: the rank of the message among the channel's messages with the same timestamp (0 unless
  one request was split into several messages), and ``row``: the row's index inside its message. A pk
  repeated inside one insert or upsert batch: the real Milvus 2.3.5 keeps every row in the message, in
  request order, all with one timestamp, and ``query`` returns the **first** one, from growing and from
  sealed segments alike (tests/milvus_real/test_repeated_pk.py). So the earlier row sorts later (wins):
  both ranks are stored reversed.

Why a decimal: the hybrid timestamp takes 59 bits today, so (ts, op, row) does not fit an int64; a
``decimal(38,0)`` is one scalar that Spark (``sequence_by`` must be orderable, non-null, one stable type),
Delta, Iceberg, DuckDB, Polars and pyarrow all compare natively. It holds ``_ts < 10**38 / 2**64``
(physical time until about the year 2600).

``msgstream_spark.mirror.order`` re-exports these for the table-keeping side (docs/mirror.md).

A snapshot row counts as a change at the snapshot's timestamp S that comes after every change at S:
``snapshot_seq(S) = (S + 1) * 2**64 - 1`` (the row part 2**32 - 1 is never a change's). A change newer
than S wins over it, an older one loses.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError

SEQ = "_seq"
SEQ_TYPE = pa.decimal128(38, 0)
SEQ_DDL = "decimal(38,0)"
OP_DELETE = 0
OP_INSERT = 1
MAX_MESSAGE = (1 << 31) - 1
MAX_ROW = (1 << 32) - 1  # a row index is below it: the row part MAX_ROW is the snapshot's
_MAX_TS = 10**38 // (1 << 64)


def seq_value(ts: int, op: str, row: int = 0, message: int = 0) -> int:
    """One ``_seq`` as a Python int (``op``: "insert" or "delete")."""
    _check_parts(ts, message, row)
    return (int(ts) << 64) | (_op_bit(op) << 63) | ((MAX_MESSAGE - int(message)) << 32) | (MAX_ROW - 1 - int(row))


def snapshot_seq(snapshot_ts: int) -> int:
    """The ``_seq`` of a snapshot row read at (at least) ``snapshot_ts``."""
    _check_parts(snapshot_ts, 0, 0)
    return ((int(snapshot_ts) + 1) << 64) - 1


def seq_array(ts: np.ndarray, op: str | np.ndarray, row: np.ndarray | None = None,
              message: int | np.ndarray = 0) -> pa.Array:
    """``_seq`` of many rows, vectorised: ``ts`` (uint64/int64 hybrid timestamps), ``op`` one string for
    all rows or a bool array (True = insert), ``row`` the index in the message (default 0..n-1)."""
    ts = np.asarray(ts).astype(np.uint64, copy=False)
    n = len(ts)
    if n and int(ts.max()) >= _MAX_TS:
        raise MirrorError(f"timestamp {int(ts.max())} is beyond what _seq can hold ({_MAX_TS - 1})")
    top_row = n - 1 if row is None else (int(np.max(row)) if n else 0)
    top_message = int(message) if isinstance(message, int) else (int(np.max(message)) if n else 0)
    if n and (top_row >= MAX_ROW or top_message > MAX_MESSAGE):
        raise MirrorError(f"row index {top_row} or message rank {top_message} out of range")
    rows = np.arange(n, dtype=np.uint64) if row is None else np.asarray(row).astype(np.uint64, copy=False)
    if isinstance(op, str) and isinstance(message, int):  # one message's rows (the read's case): one subtraction
        low = np.uint64((_op_bit(op) << 63) | ((MAX_MESSAGE - message) << 32) | (MAX_ROW - 1)) - rows
    else:
        ops = np.full(n, _op_bit(op), dtype=np.uint64) if isinstance(op, str) else np.asarray(op).astype(np.uint64)
        msg = np.uint64(MAX_MESSAGE) - np.asarray(message, dtype=np.uint64)
        low = (ops << np.uint64(63)) | (msg << np.uint64(32)) | (np.uint64(MAX_ROW - 1) - rows)
    words = np.empty((n, 2), dtype="<u8")
    words[:, 0] = low
    words[:, 1] = ts
    return pa.Array.from_buffers(SEQ_TYPE, n, [None, pa.py_buffer(words)])  # the array's own buffer: no copy


def snapshot_seq_array(snapshot_ts: int, n: int) -> pa.Array:
    """``snapshot_seq(snapshot_ts)`` on ``n`` rows."""
    _check_parts(snapshot_ts, 0, 0)
    words = np.empty((n, 2), dtype="<u8")
    words[:, 0] = np.uint64((1 << 64) - 1)
    words[:, 1] = np.uint64(snapshot_ts)
    return pa.Array.from_buffers(SEQ_TYPE, n, [None, pa.py_buffer(words.tobytes())])


def seq_parts(seq: int) -> tuple[int, str, int, int]:
    """(ts, op, message, row) of one ``_seq`` (for messages and tests)."""
    seq = int(seq)
    low = seq & ((1 << 64) - 1)
    return (seq >> 64, "insert" if low >> 63 else "delete", MAX_MESSAGE - ((low >> 32) & MAX_MESSAGE),
            MAX_ROW - 1 - (low & MAX_ROW))


def _op_bit(op: str) -> int:
    if op == "insert":
        return OP_INSERT
    if op == "delete":
        return OP_DELETE
    raise MirrorError(f"op must be 'insert' or 'delete', got {op!r}")


def _check_parts(ts: int, message: int, row: int) -> None:
    if not 0 <= int(ts) < _MAX_TS:
        raise MirrorError(f"timestamp {ts} is outside what _seq can hold (0..{_MAX_TS - 1})")
    if not 0 <= int(message) <= MAX_MESSAGE or not 0 <= int(row) < MAX_ROW:
        raise MirrorError(f"message rank {message} or row index {row} out of range")
