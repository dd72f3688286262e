"""Streaming reads: micro-batches between offsets, admission control, AvailableNow.

Runs in Spark's long-lived driver-side Python process, so it keeps a channel scanner
between calls. Nothing correctness depends on happens in ``commit`` or ``stop``: the
resolved start is recorded in the backend under the subscription (Spark may ask for
``initialOffset`` again after a failed first batch) and every batch is fully described
by its offsets.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from msgstream_spark.source.offsets import Offset, dumps, entry, normalize, resolve_start, unb64
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.source.read import list_channels
from msgstream_spark.source.scan import Scanner
from msgstream_spark.spark.partitions import plan_partitions, read_partition

log = logging.getLogger(__name__)


def start_key(opts: ReadOptions) -> str:
    """Metadata key of the recorded start: subscription + what decides the start."""
    basis = json.dumps([opts.channels, opts.channel_pattern, opts.starting, opts.starting_ts], sort_keys=True)
    digest = hashlib.sha1(basis.encode()).hexdigest()[:12]
    return f"spark-source/{opts.subscription}/initial/{digest}"


class MsgStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions, schema_json: str, pk: str | None, collection: tuple) -> None:
        self.opts = opts
        self.schema_json = schema_json
        self.pk = pk
        self.collection = collection
        self._client: Any = None
        self._scanner: Scanner | None = None
        self._target: Offset | None = None
        self._last_start: Offset | None = None

    # -- helpers ------------------------------------------------------------------------
    def _c(self) -> Any:
        if self._client is None:
            self._client = self.opts.client()
        return self._client

    def _scan(self) -> Scanner:
        if self._scanner is None:
            self._scanner = Scanner(self._c(), self.opts.output, self.opts.fail_on_data_loss)
        return self._scanner

    def _with_new_channels(self, start: Offset) -> Offset:
        if not self.opts.channel_pattern:
            return start
        out = dict(start)
        for ch in list_channels(self.opts, self._c()):
            if ch not in out:
                log.info("channel %s matches channelPattern: reading it from earliest", ch)
                out[ch] = entry(b"", 0)
        return normalize(out)

    # -- Spark API --------------------------------------------------------------------------
    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        client = self._c()
        key = start_key(self.opts)
        recorded = client.get_metadata(key)
        if recorded:
            return json.loads(recorded)
        channels = list_channels(self.opts, client)
        start = resolve_start(client, channels, self.opts.starting, self.opts.starting_ts,
                              self.opts.fail_on_data_loss, self.opts.subscription)
        client.put_metadata(key, dumps(start))
        return start

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        o = self.opts
        if o.max_rows:
            return ReadMaxRows(o.max_rows)
        if o.max_bytes:
            return ReadMaxBytes(o.max_bytes)
        if o.min_rows:
            return ReadMinRows(o.min_rows)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        start = self._with_new_channels(normalize(start))
        scan = self._scan()
        scan.refresh(start, until=self._target, timeout=self.opts.read_timeout)
        self._last_start = start
        capped = not isinstance(limit, ReadAllAvailable)
        end, rows = scan.plan_end(start, align=self.opts.align,
                                  max_rows=self.opts.max_rows if capped else None,
                                  max_bytes=self.opts.max_bytes if capped else None, cap=self._target)
        if capped and self.opts.min_rows and self._target is None and 0 < rows < self.opts.min_rows:
            return start
        return end

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        client = self._c()
        channels = list_channels(self.opts, client)
        target = {}
        for ch in channels:
            latest = client.latest_message_id(ch)
            target[ch] = entry(latest.serialize() if latest else b"", 0)
        self._target = normalize(target)

    def reportLatestOffset(self) -> dict | None:  # noqa: N802
        if self._scanner is None or self._last_start is None:
            return None
        return self._scanner.latest(self._last_start)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return plan_partitions(self._c(), normalize(start), normalize(end), self.opts, self.schema_json, self.pk,
                               self.collection)

    def read(self, partition: InputPartition):
        return read_partition(partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Best effort: show progress in the subscription for lag tools."""
        try:
            client = self._c()
            for ch, e in end.items():
                mid = unb64(e.get("msgID", ""))
                if mid:
                    client.commit_position(ch, self.opts.subscription, client.bytes_to_message_id(mid))
        except Exception:  # noqa: BLE001 - progress reporting must never fail the query
            log.warning("could not record progress of subscription %s", self.opts.subscription, exc_info=True)

    def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.close()
        if self._client is not None:
            self._client.close()
        self._scanner = self._client = None
