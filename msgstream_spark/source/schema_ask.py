"""What schema inference asks before and says after reading the channels: Milvus's description of the collection
(``describe``), and the error naming what was read when nothing told a schema (``not_found``)."""

from __future__ import annotations

import logging
from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.errors import MsgStreamError, SchemaError
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.stream.describe import milvus_schema

log = logging.getLogger("msgstream_spark.source.schema")


def described(opts: ReadOptions, client: Any, failures: list[str]) -> tuple[Any, int] | None:
    """(CollectionSchema, collection id) as Milvus describes the collection now, else ``None`` (the channels
    decide): the ``milvus`` backend's ``DescribeCollection`` of a collection in ``milvus.collections``, else,
    with config key ``milvus.address`` given, ``DescribeCollection`` at that address (whatever the backend).
    What failed is logged and added to ``failures`` (for the error when the channels tell nothing either)."""
    try:
        got = client.collection_schema(opts.collection)
    except MsgStreamError as exc:
        log.warning("schema inference reads the channels: describing collection %s failed: %s",
                    opts.collection or "(the configured one)", exc)
        got = None
    if got is not None:
        schema = schema_pb2.CollectionSchema()
        schema.ParseFromString(got[0])
        return schema, got[1]
    if not opts.milvus_named or opts.collection is None:
        return None
    try:
        described = milvus_schema(Config(dict(opts.config), source="<spark options>"), opts.collection)
    except MsgStreamError as exc:
        log.warning("schema inference reads the channels: DescribeCollection(%s) at milvus.address failed: %s",
                    opts.collection, exc)
        failures.append(f"DescribeCollection at milvus.address failed: {exc}")
        return None
    if described is None:
        failures.append("DescribeCollection at milvus.address answered without a schema")
    return described


def not_found(opts: ReadOptions, channels: list[str], looked: dict[str, str], failures: list[str]) -> SchemaError:
    """The error when no schema was found: the collection, what was read of each channel, and what to do."""
    what = f"collection {opts.collection!r}" if opts.collection else "any collection"
    read = "; ".join(f"{ch}: {looked.get(ch, 'not read')}" for ch in channels)
    lookback = opts.schema_lookback or "no bound"
    hints = [] if opts.milvus_named or not opts.collection else [
        "set config key milvus.address (the Milvus proxy, e.g. --option milvus.address=host:19530) so that "
        "the schema is asked of Milvus"]
    hints += [f"raise option schemaLookback (now {lookback}; 0: read each channel from its first message)",
              "give the schema with .schema(...) or option schema (Spark DDL)", "or use output=messages"]
    return SchemaError(
        f"cannot infer a schema: no CreateCollection or Insert message of {what} found in channel(s) "
        f"{', '.join(channels)} (messages read per channel: {read}; schemaScanMessages={opts.schema_scan_messages}, "
        f"schemaLookback={lookback})" + "".join(f"; {f}" for f in failures) + ". To read it: " + "; ".join(hints))
