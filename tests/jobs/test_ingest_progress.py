"""The ingest job's progress lag from Spark's source progress (no Spark: the offsets as Spark reports them)."""

from __future__ import annotations

import base64
import json
import struct

from msgstream_spark.jobs.ingest import Progress, _offset_lag


def _off(msg_id: int, ts: int) -> dict:
    return {"msgID": base64.b64encode(struct.pack("<q", msg_id)).decode(), "ts": ts}


def test_offsets_spark_reports_as_null_give_no_lag_and_no_error():
    # Before a source's first batch Spark's progress carries latestOffset/endOffset as the JSON text "null".
    assert _offset_lag("null", "null") == {}
    assert _offset_lag(None, json.dumps({"ch": _off(3, 5 << 18)})) == {}
    assert _offset_lag("[1, 2]", "not json") == {}


def test_lag_per_channel_in_messages_and_ms():
    latest = json.dumps({"ch": _off(10, 9000 << 18)})
    end = json.dumps({"ch": _off(4, 6000 << 18)})
    lag = _offset_lag(latest, end)
    assert lag["ch"]["ms"] == 3000


class _Query:
    def __init__(self, reports):
        self.recentProgress = reports
        self.lastProgress = reports[-1] if reports else None


def test_a_batch_reported_idle_first_still_counts_its_rows():
    # Spark reports a trigger that found no data with the id of the batch still to come; that batch, when it
    # runs, reports the same id. Counting by id alone dropped its rows (a job summary said 0 stream rows).
    idle = {"batchId": 4, "timestamp": "2026-11-24T22:00:00.000Z", "numInputRows": 0, "sources": [{}]}
    data = {"batchId": 4, "timestamp": "2026-11-24T22:00:01.000Z", "numInputRows": 50, "sources": [{}]}
    q = _Query([idle])
    p = Progress(q, 60)
    p.collect()
    q.recentProgress = [idle, data]
    p.collect()
    p.collect()  # each report counts once
    assert (p.rows, p.batches) == (50, 2)
