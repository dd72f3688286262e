"""The library call of one micro-batch: collapse the changes per pk, merge them into the table, once."""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.mirror.collapse import collapse
from msgstream_spark.mirror.table import MirrorTable


def apply_batch(table: MirrorTable, changes: pa.Table, pk: str, query_id: str, batch_id: int) -> bool:
    """Apply one batch of ``rows`` changes (``op``, the fields, ``_ts``, ``_seq``, ``_partition``) to
    ``table``: True if applied, False if this query's batch ``batch_id`` is already in the table.

    Put it in your own ``foreachBatch`` (``df.toArrow()`` of a micro-batch that fits the driver) or
    use jobs/mirror.py, which collapses in Spark first.
    """
    last = table.last_batch(query_id)
    if last is not None and last >= batch_id:
        return False
    return table.merge(collapse(changes, pk), query_id=query_id, batch_id=batch_id)
