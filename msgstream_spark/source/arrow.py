"""The library's read without Spark: Milvus's changes as Arrow record batches.

    from msgstream_spark.source import read_arrow
    for batch in read_arrow({"mq": {"type": "local"}, "local": {"path": "msgstream.db"}}, "by-dev-rootcoord-dml_0"):
        ...  # pyarrow.RecordBatch: op, the collection's fields, _channel, _ts, _position, ...

The same options, schema and rows as ``spark.read.format("msgstream")`` (docs/spark-source.md):
the plan, the ranges and the per-range read are the ones Spark's partitions run, one range after the
other in this process.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from msgstream_spark.config import Config
from msgstream_spark.source.apply import COLLECTION_META
from msgstream_spark.source.ddl import ddl_arrow_schema
from msgstream_spark.source.offsets import Offset, resolve_end, resolve_start
from msgstream_spark.source.options import CONFIG_PREFIXES, ReadOptions, parse_read_options
from msgstream_spark.source.read import ReadRange, collection_filter, list_channels, plan_reads, read_range
from msgstream_spark.source.rows import OP, rows_schema_ddl
from msgstream_spark.source.schema import infer_arrow, user_pk


def read_options(config: Config | Mapping[str, Any] | str | None, channels: str | Sequence[str] | None,
                 start: str | None = None, end: str | None = None, **options: Any) -> ReadOptions:
    """The validated options of a batch read: ``config`` is a :class:`Config`, a nested or dotted mapping,
    a YAML path, or None (the packaged embedded-log config, overridable by ``mq.type=...`` style options);
    ``start``/``end`` are ``startingPositions``/``endingPositions`` (earliest, latest, JSON or base64)."""
    opts: dict[str, Any] = dict(options)
    if channels is not None:
        opts["channels"] = channels if isinstance(channels, str) else ",".join(channels)
    if start is not None:
        opts["startingPositions"] = start
    if end is not None:
        opts["endingPositions"] = end
    if isinstance(config, str):
        opts["config"] = config
    parsed = parse_read_options(opts, streaming=False)
    if config is None or isinstance(config, str):
        return parsed
    base = config if isinstance(config, Config) else Config.from_dict(config)
    overrides = {k: v for k, v in opts.items() if str(k).lower().startswith(CONFIG_PREFIXES)}
    return dataclasses.replace(parsed, config=(base.with_overrides(overrides) if overrides else base).to_dict())


def output_schema(opts: ReadOptions, channels: list[str]) -> tuple[pa.Schema, str | None, int | None]:
    """(Arrow schema, pk name, collection id): the ``schema`` option's, else the inferred one."""
    if opts.schema_ddl:
        ddl = rows_schema_ddl(opts.schema_ddl) if opts.output == "rows" else opts.schema_ddl
        schema = ddl_arrow_schema(ddl)
        return schema, user_pk(schema), None
    return infer_arrow(opts, channels)


def schema_json(schema: pa.Schema, cid: int | None) -> str:
    """What a range carries of its query's schema (the shape of Spark's JSON: names, the collection id)."""
    fields = [{"name": f.name, "metadata": {COLLECTION_META: cid} if f.name == OP and cid is not None else {}}
              for f in schema]
    return json.dumps({"type": "struct", "fields": fields})


def plan_read(opts: ReadOptions) -> tuple[pa.Schema, list[ReadRange]]:
    """The output's schema and the ranges of a batch read (resolved once: the end is fixed here)."""
    client = opts.client()
    try:
        channels = list_channels(opts, client)
        schema, pk, cid = output_schema(opts, channels)
        start: Offset = resolve_start(client, channels, opts.starting, opts.starting_ts, opts.fail_on_data_loss,
                                      opts.subscription)
        end: Offset = resolve_end(client, channels, opts.ending, opts.ending_ts)
        ranges = plan_reads(client, start, end, opts, schema_json(schema, cid), pk, collection_filter(opts))
    finally:
        client.close()
    return schema, ranges


def read_arrow(config: Config | Mapping[str, Any] | str | None, channels: str | Sequence[str] | None,
               start: str | None = None, end: str | None = None, **options: Any) -> Iterator[pa.RecordBatch]:
    """Read ``channels`` from ``start`` (default earliest) to ``end`` (default: latest as of the call) as
    Arrow record batches: the rows (or ``output="messages"``) of ``spark.read.format("msgstream")`` with the
    same options, e.g. ``collection="c"``, ``endingTimestamp=...``, ``messageTypes="insert"``.

    Batches come channel after channel, each channel's in broker order; nothing is collected in memory.
    ``pyarrow.Table.from_batches`` (or ``pa.RecordBatchReader``) hands them to pandas, Polars or DuckDB.
    """
    opts = read_options(config, channels, start, end, **options)
    schema, ranges = plan_read(opts)
    return _read(schema, ranges)


def _read(schema: pa.Schema, ranges: list[ReadRange]) -> Iterator[pa.RecordBatch]:
    if not ranges:
        return
    client = ranges[0].opts.client()  # one client for every channel's range
    try:
        for r in ranges:
            yield from read_range(r, schema, client)
    finally:
        client.close()


def read_table(config: Config | Mapping[str, Any] | str | None, channels: str | Sequence[str] | None,
               start: str | None = None, end: str | None = None, **options: Any) -> pa.Table:
    """:func:`read_arrow` gathered into one ``pyarrow.Table`` (for small reads)."""
    opts = read_options(config, channels, start, end, **options)
    schema, ranges = plan_read(opts)
    return pa.Table.from_batches(list(_read(schema, ranges)), schema=schema)


__all__ = ["plan_read", "read_arrow", "read_options", "read_table"]
