"""What a Lance mirror table records of its writers: each query's last batch and the writer epoch.

They ride on the versions' transactions (``transaction_properties``, kept in ``_transactions/`` and read back
with ``read_transaction``): every commit of the mirror carries the whole record (every query's last batch id and
the writer epoch, marked with ``RECORDS``), so the newest version that carries one holds it; versions another
tool committed (a compaction by ``optimize``, an index build) carry none and are skipped. Before old versions are
cleaned up the record is also written into the dataset's config (``UpdateConfig``), which every later version
keeps: the fallback when the versions that carried it are gone.

The writer epoch is published by a no-op ``Merge`` (the fragments and schema as they are): Lance refuses every
``Update`` and ``Merge`` based on a version before it (a concurrent ``Merge`` preempts them), so a deposed writer's
commit planned before the new epoch landed cannot be rebased over it.
"""

from __future__ import annotations

import logging
from typing import Any

from msgstream_spark.mirror.common import PROP_WRITER_EPOCH

log = logging.getLogger(__name__)

RECORDS = "msgstream.records"  # "1" on a transaction that carries the whole record
BATCH_OF = "msgstream.batch."  # + query id -> the query's last batch id


def is_record(key: str) -> bool:
    return key.startswith(BATCH_OF) or key == PROP_WRITER_EPOCH


def read_records(ds: Any) -> dict[str, str]:
    """The record as of ``ds``'s version: the newest transaction that carries one, else the config's."""
    v = ds.version
    while v >= 1:
        try:
            tx = ds.read_transaction(v)
        except (OSError, ValueError) as e:  # a version cleaned up: older ones are gone too
            log.debug("no transaction of version %s (%s): the record is the config's", v, e)
            break
        props = dict(tx.transaction_properties or {}) if tx is not None else {}
        if props.get(RECORDS):
            return {k: val for k, val in props.items() if is_record(k)}
        v -= 1
    return {k: val for k, val in ds.config().items() if is_record(k)}


class KnownRecords:
    """The record as of the newest version a table handle read or committed (a version's record never changes:
    read once, not at each step of a batch; one this handle committed is known without reading it back)."""

    def __init__(self) -> None:
        self._at: tuple[int, dict[str, str]] | None = None

    def read(self, ds: Any) -> dict[str, str]:
        if self._at is None or self._at[0] != ds.version:
            self._at = (ds.version, read_records(ds))
        return dict(self._at[1])

    def committed(self, version: int, props: dict[str, str]) -> None:
        """Version ``version`` committed with transaction properties ``props``."""
        if props.get(RECORDS):
            self._at = (version, {k: v for k, v in props.items() if is_record(k)})


def last_batch(records: dict[str, str], query_id: str) -> int | None:
    v = records.get(BATCH_OF + query_id)
    return None if v is None else int(v)


def epoch(records: dict[str, str]) -> int:
    return int(records.get(PROP_WRITER_EPOCH, 0))


def with_batch(records: dict[str, str], query_id: str, batch_id: int) -> dict[str, str]:
    return {**records, BATCH_OF + query_id: str(int(batch_id)), RECORDS: "1"}


def with_epoch(records: dict[str, str], value: int) -> dict[str, str]:
    return {**records, PROP_WRITER_EPOCH: str(int(value)), RECORDS: "1"}
