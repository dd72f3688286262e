"""The snapshot's read: ranges planned where the keys are, answers sized by bytes, decoded column by column.

Spark-free. The driver counts each partition (``count(*)``) and cuts it into ranges of about a task's share
of the rows (:func:`plan_ranges`, mirror/snapshot/query/plan.py: about one call a cut). A task cuts its range
the same way into pieces of about ``answer_bytes`` (the row width measured on a first answer), each cut found
while the pieces before it are read, reads each piece with one ``Query`` without ``limit`` (Milvus bounds such
a query by ``maxOutputSize`` and the gRPC send size, not by the 16,384-row window), several in flight, and
decodes each answer into a record batch (mirror/snapshot/query/answer.py). A piece Milvus refuses as too
large is halved and read again; a piece that shrank or grew meanwhile is simply read as it is now.

Pinned reads (``QueryTarget.pin_ts``): Milvus answers an iterator query in key order and stops merging
its shards' results when one of them is drained (``reduce.ShouldStopWhenDrained``), so a pinned piece
is read again after its last key until an answer comes back empty.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.query.answer import answer_batch
from msgstream_spark.mirror.snapshot.query.plan import KeyProbe, pieces
from msgstream_spark.mirror.snapshot.query.ranges import PkRange, halves
from msgstream_spark.mirror.snapshot.query.rpc import AnswerTooLarge, Querier, QueryTarget

log = logging.getLogger(__name__)

DEFAULT_ANSWER_BYTES = 16 << 20  # well under maxOutputSize (100 MiB) and the 2.3 template's 64 MiB send size
DEFAULT_ROW_BYTES = 1024


def row_bytes(q: Querier, pk: str, is_string: bool, whole: PkRange, sample: int = 256) -> int:
    """Bytes per row of a query answer, measured on the range's first ``sample`` keys."""
    resp = q.call(q.request(whole.expr(pk, is_string), ["*"], whole.partition_names, limit=sample, pinned=False),
                  "a sample of rows")
    n = _rows(resp, pk)
    return max(16, resp.ByteSize() // n) if n else DEFAULT_ROW_BYTES


def plan_ranges(q: Querier, pk: str, is_string: bool, tasks: int,
                partitions: list[tuple[str, int]] | None = None) -> list[PkRange]:
    """About ``tasks`` ranges of about equal counts covering every key (of each partition when
    ``partitions`` (name, id) is given: every partition gets at least one range). One ``count(*)`` per
    partition, then about one call per cut (``q.calls`` counts them)."""
    wholes = [PkRange(partition=n, partition_id=i) for n, i in partitions] if partitions else [PkRange()]
    probe = KeyProbe(q, pk, is_string)
    counted = [(w, probe.count(w)) for w in wholes]
    want = max(1, -(-sum(n for _, n in counted) // max(1, tasks)))
    return [p for w, n in counted for p in pieces(probe, w, want, is_string, n)]


def _rows(resp: Any, pk: str) -> int:
    for fd in resp.fields_data:
        if fd.field_name == pk:
            return len(fd.scalars.string_data.data) or len(fd.scalars.long_data.data)
    return 0


def _last_key(resp: Any, pk: str) -> Any:
    fd = next(f for f in resp.fields_data if f.field_name == pk)
    data = fd.scalars.string_data.data if len(fd.scalars.string_data.data) else fd.scalars.long_data.data
    return data[len(data) - 1]


@dataclass
class ReadStats:
    """Rows and answer bytes read so far, and the ``Query`` calls of finished reads (thread-safe)."""

    rows: int = 0
    bytes: int = 0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rows: int, nbytes: int, calls: int = 0) -> None:
        with self._lock:
            self.rows += rows
            self.bytes += nbytes
            self.calls += calls


@dataclass
class RangeReader:
    """Reads ranges of one collection into record batches of ``schema`` (the table's columns). Plain
    data: Spark tasks get a copy."""

    target: QueryTarget
    pk: str
    pk_is_string: bool
    schema: pa.Schema
    snapshot_ts: int
    answer_bytes: int = DEFAULT_ANSWER_BYTES
    row_bytes: int = DEFAULT_ROW_BYTES
    in_flight: int = 2

    def read(self, ranges: list[PkRange], stats: ReadStats | None = None) -> Iterator[pa.RecordBatch]:
        """Every row of ``ranges``, piece by piece in order, ``in_flight`` queries at a time."""
        stats = stats or ReadStats()
        depth = max(1, self.in_flight)
        q = Querier(self.target)
        try:
            with ThreadPoolExecutor(depth, thread_name_prefix="snapshot-query") as pool:
                window: deque = deque()
                for piece in self._pieces(q, ranges):
                    window.append(pool.submit(self._read_piece, q, piece, stats))
                    if len(window) >= depth:
                        yield from window.popleft().result()
                while window:
                    yield from window.popleft().result()
        finally:
            stats.add(0, 0, q.calls)
            q.close()

    def _pieces(self, q: Querier, ranges: list[PkRange]) -> Iterator[PkRange]:
        """Each range cut into pieces of about ``answer_bytes``, each cut found as the read reaches it."""
        probe = KeyProbe(q, self.pk, self.pk_is_string)
        per_answer = max(1, self.answer_bytes // max(1, self.row_bytes))
        for rng in ranges:
            yield from pieces(probe, rng, per_answer, self.pk_is_string, rng.rows, tolerance=0.25)

    def _read_piece(self, q: Querier, piece: PkRange, stats: ReadStats) -> list[pa.RecordBatch]:
        """Every row of ``piece`` as batches: halved while Milvus refuses an answer as too large, read on
        after the last key while a pinned answer is not empty."""
        out: list[pa.RecordBatch] = []
        todo = [piece]
        while todo:
            p = todo.pop()
            expr = p.expr(self.pk, self.pk_is_string)
            try:
                resp = q.call(q.request(expr, ["*"], p.partition_names), f"the rows of range {p}")
            except AnswerTooLarge as exc:
                cut = halves(p, self.pk_is_string)
                if cut is None:
                    raise MirrorError(f"{self.target.where()}: the answer for range {p} (one key) is refused as "
                                      f"too large: {exc}") from exc
                log.info("range %s: the answer is too large, read in halves (%s)", p, exc)
                todo += [cut[1], cut[0]]
                continue
            n = _rows(resp, self.pk)
            if not n:
                continue
            out.append(answer_batch(resp.fields_data, self.schema, self.pk, self.snapshot_ts, p.partition_id))
            stats.add(n, resp.ByteSize())
            if self.target.pin_ts:  # an iterator answer may end where one shard's rows ended
                todo.append(replace(p, lo=_last_key(resp, self.pk), after=True, rows=-1))
        return out
