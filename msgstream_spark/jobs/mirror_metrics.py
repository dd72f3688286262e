"""The mirror job's figures: a Prometheus endpoint (``--metrics-port``) and one JSON line per batch in the log.

Served from the driver (where batches commit and maintenance runs), from a registry of the job's own. Names
follow Prometheus's conventions (``msgstream_mirror_`` prefix, base units, ``_total`` on counters); every
per-table series has the labels ``table`` (the location as given) and ``collection``. The list with meanings:
docs/mirror.md, "Metrics". The JSON line of each batch goes to the logger :data:`BATCH_LOGGER` at INFO.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from msgstream_spark.mirror.watermark import physical_ms

BATCH_LOGGER = "msgstream_spark.mirror.batches"
PREFIX = "msgstream_mirror_"
SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
log = logging.getLogger(BATCH_LOGGER)


def _metrics(r: CollectorRegistry) -> dict[str, Any]:
    t = ["table", "collection"]
    return {
        "batches": Counter(PREFIX + "batches", "micro-batches by outcome (committed, skipped)", [*t, "outcome"],
                           registry=r),
        "rows": Counter(PREFIX + "rows_applied", "rows applied to the table by op (insert, update, delete)",
                        [*t, "op"], registry=r),
        "errors": Counter(PREFIX + "errors", "failures by kind (batch, maintenance)", [*t, "kind"], registry=r),
        "batch_s": Histogram(PREFIX + "batch_seconds", "a committed batch on the driver, maintenance excluded", t,
                             buckets=SECONDS_BUCKETS, registry=r),
        "commit_s": Histogram(PREFIX + "commit_seconds", "a batch's table commit", t, buckets=SECONDS_BUCKETS,
                              registry=r),
        "version": Gauge(PREFIX + "table_version", "the table's version (Delta: log version; Iceberg: last "
                         "sequence number)", t, registry=r),
        "freshness": Gauge(PREFIX + "freshness_seconds", "at the last commit: wall clock minus the Milvus time the "
                           "table is complete to", t, registry=r),
        "lag": Gauge(PREFIX + "lag_seconds", "now minus the Milvus time the table is complete to (grows while "
                     "nothing commits)", t, registry=r),
        "watermark": Gauge(PREFIX + "watermark_timestamp_seconds", "the Milvus time the table is complete to", t,
                           registry=r),
        "runs": Counter(PREFIX + "maintenance_runs", "maintenance runs by task (compact, merge_manifests, expire)",
                        [*t, "task"], registry=r),
        "m_errors": Counter(PREFIX + "maintenance_errors", "failed maintenance runs by task", [*t, "task"],
                            registry=r),
        "m_last": Gauge(PREFIX + "maintenance_last_success_timestamp_seconds", "the last successful run by task",
                        [*t, "task"], registry=r),
        "versions": Gauge(PREFIX + "table_versions_kept", "versions (snapshots, log versions) the table keeps, "
                          "after the last expiry", t, registry=r),
        "meta_bytes": Gauge(PREFIX + "table_metadata_bytes", "bytes of the table's metadata (Delta log, Iceberg "
                            "metadata directory), after the last expiry", t, registry=r),
        "channel": Gauge(PREFIX + "channel_position_timestamp_seconds", "per channel, the Milvus time of the "
                         "position the job has committed to", ["channel"], registry=r),
    }


def channel_backlog(progress: Any) -> dict[str, dict[str, int]]:
    """Per channel the backlog in a streaming query's progress (a dict or Spark's ``StreamingQueryProgress``):
    between the channel's latest position the source saw (``latestOffset``) and the end of the last batch the job
    ran to the end (``endOffset``; its tables committed): ``ms`` on Milvus's clock, and ``messages`` where the
    log's message ids count messages (the embedded log's, Kafka's offsets)."""
    from msgstream_spark.jobs.ingest import _offset_lag

    if progress is None:
        return {}
    d = progress if isinstance(progress, dict) else json.loads(progress.json)
    out: dict[str, dict[str, int]] = {}
    for s in d.get("sources") or []:
        out.update(_offset_lag(s.get("latestOffset"), s.get("endOffset")))
    return out


class BacklogCollector:
    """``msgstream_mirror_backlog_seconds`` / ``_messages`` per channel, read from the job's query's last progress
    at each scrape (nothing before the query starts or before its first batch ends)."""

    def __init__(self) -> None:
        self.query: Any = None

    def collect(self):
        secs = GaugeMetricFamily(PREFIX + "backlog_seconds", "per channel, Milvus time between the channel's "
                                 "latest position and what the job has applied", labels=["channel"])
        msgs = GaugeMetricFamily(PREFIX + "backlog_messages", "per channel, messages between the channel's latest "
                                 "position and what the job has applied", labels=["channel"])
        try:
            lag = channel_backlog(self.query.lastProgress) if self.query is not None else {}
        except Exception as exc:  # noqa: BLE001 - a scrape never fails the job; said in the log
            logging.getLogger(__name__).warning("backlog metric: the query's progress is unreadable: %s", exc)
            lag = {}
        for ch, v in sorted(lag.items()):
            if "ms" in v:
                secs.add_metric([ch], v["ms"] / 1000)
            if "messages" in v:
                msgs.add_metric([ch], v["messages"])
        yield secs
        yield msgs


class StagedCollector:
    """``msgstream_mirror_staged_batches`` / ``_bytes`` per pending collection (its snapshot running beside the
    stream): the batches staged for its handover and their bytes, from ``figures`` at each scrape (``(table,
    collection, batches, bytes)`` rows; a collection handed over has none)."""

    def __init__(self, figures) -> None:
        self.figures = figures

    def collect(self):
        t = ["table", "collection"]
        batches = GaugeMetricFamily(PREFIX + "staged_batches", "per collection pending its snapshot, the batches "
                                    "staged for its handover", labels=t)
        size = GaugeMetricFamily(PREFIX + "staged_bytes", "per collection pending its snapshot, the bytes of its "
                                 "staged batches", labels=t)
        for table, collection, n, b in self.figures():
            batches.add_metric([table, collection], n)
            size.add_metric([table, collection], b)
        yield batches
        yield size


class MetricsHub:
    """The job's registry and its HTTP endpoint (``port``: served; None: not served; 0: any free port), shared by
    the ``JobMetrics`` of every table the job writes (a many-collection job: one endpoint, a series per table)."""

    def __init__(self, port: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self.m = _metrics(self.registry)
        self.backlog = BacklogCollector()
        self.registry.register(self.backlog)
        self.server = self.port = None
        if port is not None:
            self.server, _ = start_http_server(port, addr="0.0.0.0", registry=self.registry)
            self.port = self.server.server_port

    def watch(self, query: Any) -> None:
        """The job's streaming query, whose progress the backlog metric reads."""
        self.backlog.query = query

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class JobMetrics:
    """A ``MirrorBatch`` observer: the figures of each batch as metrics (``port``: served over HTTP; None:
    not served; ``hub``: the job's shared registry and endpoint instead) and as the batch's JSON log line.
    ``upkeep``: the table's maintenance, whose runs it counts."""

    def __init__(self, table, upkeep=None, port: int | None = None, hub: MetricsHub | None = None) -> None:
        self._own = hub is None
        self.hub = hub if hub is not None else MetricsHub(port)
        self.registry, self.m, self.port = self.hub.registry, self.hub.m, self.hub.port
        self.labels = {"table": str(table.location), "collection": str(table.collection)}
        self.upkeep = upkeep
        self._seen_runs: dict[str, int] = {}
        self._seen_errors: dict[str, int] = {}
        self.new_runs: list = []  # the maintenance runs since the last batch's line
        self.watermark_ms: int | None = None
        self._series: dict[tuple, Any] = {}  # (metric, its other labels' values) -> this table's series
        self._s("lag").set_function(self._lag)
        if upkeep is not None:
            self._maintenance()

    def _s(self, name: str, **more: str) -> Any:
        """This table's series of metric ``name`` (``more``: its other labels), looked up once: a batch of a
        database job tells 20 tables' series, and ``labels()`` checks and locks at each call."""
        key = (name, *more.values())
        got = self._series.get(key)
        if got is None:
            got = self._series[key] = self.m[name].labels(**self.labels, **more)
        return got

    def _channel(self, ch: str) -> Any:
        key = ("channel", ch)  # a per-channel series (no table label): the job's, shared by its tables
        got = self._series.get(key)
        if got is None:
            got = self._series[key] = self.m["channel"].labels(channel=ch)
        return got

    def _lag(self) -> float:
        return float("nan") if self.watermark_ms is None else max(0.0, time.time() - self.watermark_ms / 1000)

    def after_batch(self, report, hold=None) -> None:
        self._s("batches", outcome="committed" if report.committed else "skipped").inc()
        if report.committed:
            for op, n in report.ops.items():
                self._s("rows", op=op).inc(n)
            self._s("batch_s").observe(report.seconds)
            self._s("commit_s").observe(report.step_seconds.get("commit", 0.0))
            if report.freshness_ms is not None:
                self._s("freshness").set(report.freshness_ms / 1000)
        times = [int(e.get("ts", 0)) for e in (report.watermark or {}).values() if int(e.get("ts", 0)) > 0]
        if times:
            self.watermark_ms = physical_ms(min(times))
            self._s("watermark").set(self.watermark_ms / 1000)
        for ch, e in (report.watermark or {}).items():
            if int(e.get("ts", 0)) > 0:
                self._channel(ch).set(physical_ms(int(e["ts"])) / 1000)
        version = self.upkeep.version() if self.upkeep is not None else None
        if version is not None:
            self._s("version").set(version)
        self._maintenance()
        log.info(json.dumps(self.line(report, version), sort_keys=True))

    def batch_failed(self, batch_id: int, error: BaseException) -> None:
        self._s("errors", kind="batch").inc()
        log.info(json.dumps({"table": self.labels["table"], "batch": batch_id, "error": f"{type(error).__name__}: "
                             f"{error}"[:500]}, sort_keys=True))

    def _maintenance(self) -> None:
        up = self.upkeep
        if up is None:
            return
        fresh = sum(up.runs.values()) - sum(self._seen_runs.values())
        self.new_runs = up.history[-fresh:] if fresh > 0 else []
        for task, n in up.runs.items():
            self._s("runs", task=task).inc(n - self._seen_runs.get(task, 0))
            self._seen_runs[task] = n
        for task, n in up.errors.items():
            self._s("m_errors", task=task).inc(n - self._seen_errors.get(task, 0))
            self._s("errors", kind="maintenance").inc(n - self._seen_errors.get(task, 0))
            self._seen_errors[task] = n
        for task, at in up.last.items():
            self._s("m_last", task=task).set(at)
        figs = up.table_figures
        if figs:
            self._s("versions").set(figs.get("versions", 0))
            self._s("meta_bytes").set(figs.get("metadata_bytes", 0))

    def line(self, report, version: int | None) -> dict[str, Any]:
        """The batch's JSON log line: the same figures as the metrics."""
        up = self.upkeep
        return {"table": self.labels["table"], "collection": self.labels["collection"], "batch": report.batch_id,
                "committed": report.committed, "rows": report.ops, "changes": report.changes,
                "batch_seconds": report.seconds, "step_seconds": report.step_seconds,
                "freshness_seconds": None if report.freshness_ms is None else report.freshness_ms / 1000,
                "lag_seconds": None if self.watermark_ms is None else round(self._lag(), 3),
                "table_version": version,
                "channels": {ch: int(e.get("ts", 0)) for ch, e in sorted((report.watermark or {}).items())},
                "maintenance": None if up is None else {"runs": up.runs, "errors": up.errors,
                                                        "this_batch": [vars(r) for r in self.new_runs],
                                                        "history": up.table_figures}}

    def close(self) -> None:
        if self._own:  # a shared hub is closed by the job
            self.hub.close()
