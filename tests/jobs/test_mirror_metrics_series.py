"""A table's metrics after each batch (``jobs.mirror_metrics.JobMetrics``, a ``MirrorBatch`` observer) update series
it looked up once (issue #44: a database job tells 20 tables' metrics every batch, and each ``labels()`` lookup
checks the labels and takes the metric's lock: 20 lookups a table and batch were a fifth of the driver's CPU after
its commits). The figures are the same: read back from the registry as a scrape reads them. A real Delta table,
its real maintenance (``mirror.upkeep.Upkeep``)."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase

from msgstream_spark.jobs.mirror_metrics import JobMetrics, MetricsHub
from msgstream_spark.mirror.policy import MaintenancePolicy
from msgstream_spark.mirror.report import BatchReport
from msgstream_spark.mirror.upkeep import Upkeep
from tests.mirror.test_deposed_writer import Place


def _value(hub: MetricsHub, name: str, **labels: str) -> float:
    return hub.registry.get_sample_value(name, labels)


def test_a_tables_series_are_looked_up_once_and_show_every_batch(tmp_path, monkeypatch):
    table = Place("local", tmp_path).open("delta")
    upkeep = Upkeep(table, MaintenancePolicy(expire_every=0, compact_every=0))
    hub = MetricsHub(None)
    metrics = JobMetrics(table, upkeep, hub=hub)
    lookups: list[str] = []
    real = MetricWrapperBase.labels

    def counted(metric, *a, **kw):
        lookups.append(metric._name)
        return real(metric, *a, **kw)

    monkeypatch.setattr(MetricWrapperBase, "labels", counted)
    for b in range(3):
        metrics.after_batch(BatchReport(b, True, changes=5, ops={"insert": 4, "update": 1, "delete": 0},
                                        seconds=0.5, step_seconds={"commit": 0.1},
                                        watermark={"ch0": {"ts": (1_700_000_000_000 + b) << 18}}))
        if b == 0:
            first, lookups = lookups, []
    assert first, "the first batch looks its series up"
    assert lookups == [], f"later batches looked series up again: {lookups}"
    t = {"table": str(table.location), "collection": "coll"}
    assert _value(hub, "msgstream_mirror_rows_applied_total", **t, op="insert") == 12
    assert _value(hub, "msgstream_mirror_batches_total", **t, outcome="committed") == 3
    assert _value(hub, "msgstream_mirror_batch_seconds_count", **t) == 3
    assert _value(hub, "msgstream_mirror_watermark_timestamp_seconds", **t) == 1_700_000_000.002
    assert _value(hub, "msgstream_mirror_channel_position_timestamp_seconds", channel="ch0") == 1_700_000_000.002
