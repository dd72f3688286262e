"""Options of the ``msgstream`` source: parsed and validated on the driver at ``load()``.

Every error names the option and what it accepts. The result is plain data
(:class:`ReadOptions`), pickled into partitions and readers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.errors import ConfigError, OptionError
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import tso
from msgstream_spark.source.tailscan import LOOKBACK

log = logging.getLogger(__name__)

CONFIG_PREFIXES = ("mq.", "kafka.", "pulsar.", "local.", "milvus.", "msgchannel.", "rootcoord.", "msgstream.")
OUTPUTS = ("rows", "messages", "collections")
UPSERT_AS = ("insert-delete", "update")
DECODE_ERROR_POLICIES = ("fail", "skip")
SCHEMA_CHANGE_POLICIES = ("fail", "ignore")
MESSAGE_TYPES = ("insert", "delete", "timetick", "createcollection", "dropcollection", "createpartition",
                 "droppartition")
ROW_TYPES = ("insert", "delete")

READ_OPTIONS = {
    "config": "path of a msgstream.yaml / milvus.yaml",
    "channels": "comma-separated channel names",
    "channelpattern": "regex of channel names (new matches are picked up)",
    "subscription": "subscription name (records start positions and progress)",
    "startingpositions": "earliest | latest | JSON per channel (MsgPosition, 2.6 WALCheckpoint or MessageID) | "
                         "base64 MsgPosition list",
    "endingpositions": "latest | JSON per channel | base64 MsgPosition list (batch only)",
    "startingtimestamp": "hybrid timestamp or ISO-8601",
    "endingtimestamp": "hybrid timestamp or ISO-8601 (batch only)",
    "maxrowspertrigger": "positive integer",
    "maxbytespertrigger": "positive integer",
    "minrowspertrigger": "positive integer",
    "aligntotimetick": "true | false (default: true for streams when the channels carry time ticks)",
    "failondataloss": "true | false (default true)",
    "schemascanmessages": "messages a first schema inference reads per channel, newest first (default 512; "
                          "0: from the first message)",
    "schemalookback": "the most messages a first schema inference reads per channel when the newest "
                      "schemaScanMessages hold none of the collection, the window doubling (default 65536; "
                      "0: no bound)",
    "output": "rows | messages | collections",
    "messagetypes": "comma-separated: insert, delete, timetick, createcollection, dropcollection, ...",
    "collection": "collection name or id",
    "ondecodeerror": "fail | skip",
    "onschemachange": "fail | ignore: a 2.6 AlterCollection adding a field the query's schema lacks",
    "minpartitions": "positive integer: at least this many read tasks (channel ranges cut at safe messages)",
    "maxrecordsperpartition": "positive integer: at most this many messages a read task (as planned)",
    "dedupe": "true | false: drop replayed sink batches (exactly-once with the msgstream sink)",
    "removalrows": "true | false (output=rows): also one row per DropPartition / TruncateCollection copy of the "
                   "collection, op drop_partition / truncate (a mirror deletes what they removed)",
    "upsertas": "insert-delete (default) | update: an upsert (an insert and a delete of a key at one timestamp) "
                "as one row with op update",
    "schema": "Spark DDL of the collection's fields (else inferred)",
    "readtimeout": "seconds a task waits for a message it knows exists (default 60)",
    "maxbatchrows": "rows per Arrow batch yielded by a task (default 8192)",
    "path": "alias of channels",
}


def _bool(opts: Mapping[str, str], key: str, default: bool | None) -> bool | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    s = str(raw).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {key} must be true or false, got {raw!r}")


def _pos_int(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {key} must be a positive integer, got {raw!r}") from None
    if v <= 0:
        raise OptionError(f"option {key} must be a positive integer, got {raw!r}")
    return v


def _choice(opts: Mapping[str, str], key: str, choices: tuple[str, ...], default: str) -> str:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    v = str(raw).strip().lower()
    if v not in choices:
        raise OptionError(f"option {key} must be one of {', '.join(choices)}, got {raw!r}")
    return v


def _timestamp(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return None

    try:
        return tso.parse_timestamp(str(raw))
    except ValueError as exc:
        raise OptionError(f"option {key}: {exc}") from None


@dataclass
class ReadOptions:
    """Validated source options (plain data)."""

    config: dict[str, Any]
    channels: tuple[str, ...] = ()
    channel_pattern: str | None = None
    subscription: str = ""
    starting: str | None = None
    ending: str | None = None
    starting_ts: int | None = None
    ending_ts: int | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    min_rows: int | None = None
    align: bool | None = None
    fail_on_data_loss: bool = True
    output: str = "rows"
    message_types: tuple[str, ...] | None = None
    collection: str | None = None
    on_decode_error: str = "fail"
    on_schema_change: str = "fail"
    min_partitions: int | None = None
    max_records: int | None = None  # maxRecordsPerPartition
    dedupe: bool = False
    removal_rows: bool = False  # removalRows: rows output carries DropPartition / TruncateCollection rows
    upsert_as: str = "insert-delete"  # upsertAs: "update" pairs an upsert's two rows into one
    schema_ddl: str | None = None
    read_timeout: float = 60.0
    batch_rows: int = 8192
    schema_scan_messages: int = 512  # schemaScanMessages: a first inference's budget per channel (0: no bound)
    schema_lookback: int = LOOKBACK  # schemaLookback: how far back it goes when that finds nothing (0: no bound)
    milvus_named: bool = False  # config key milvus.address given: the schema is asked of Milvus first
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def mq_type(self) -> str:
        return Config(dict(self.config)).mq_type

    def client(self):
        """A new backend client (the caller closes it)."""

        cfg = Config(dict(self.config), source="<spark options>")
        return build_client(cfg.mq_type, cfg)


def parse_read_options(options: Mapping[str, Any], *, streaming: bool | None) -> ReadOptions:
    """Validate every option; unknown ones are errors listing the known options."""

    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in options.items()}
    overrides = {k: v for k, v in opts.items() if k.startswith(CONFIG_PREFIXES)}
    unknown = sorted(k for k in opts if k not in READ_OPTIONS and k not in overrides)
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)}; known options: "
                          f"{', '.join(sorted(READ_OPTIONS))}, and config keys such as kafka.brokerList")
    try:
        cfg = Config.load(opts.get("config") or None, overrides=overrides or None)
        _ = cfg.mq_type
    except ConfigError as exc:
        raise OptionError(f"option config: {exc}") from exc
    channels, pattern = _channels(opts)
    starting = opts.get("startingpositions") or None
    ending = opts.get("endingpositions") or None
    r = ReadOptions(
        config=cfg.to_dict(), channels=channels, channel_pattern=pattern,
        subscription=opts.get("subscription") or "",
        starting=starting, ending=ending,
        starting_ts=_timestamp(opts, "startingtimestamp"), ending_ts=_timestamp(opts, "endingtimestamp"),
        max_rows=_pos_int(opts, "maxrowspertrigger"), max_bytes=_pos_int(opts, "maxbytespertrigger"),
        min_rows=_pos_int(opts, "minrowspertrigger"), align=_bool(opts, "aligntotimetick", None),
        fail_on_data_loss=bool(_bool(opts, "failondataloss", True)),
        output=_choice(opts, "output", OUTPUTS, "rows"),
        collection=(opts.get("collection") or None),
        on_decode_error=_choice(opts, "ondecodeerror", DECODE_ERROR_POLICIES, "fail"),
        on_schema_change=_choice(opts, "onschemachange", SCHEMA_CHANGE_POLICIES, "fail"),
        min_partitions=_pos_int(opts, "minpartitions"), max_records=_pos_int(opts, "maxrecordsperpartition"),
        dedupe=bool(_bool(opts, "dedupe", False)), removal_rows=bool(_bool(opts, "removalrows", False)),
        upsert_as=_choice(opts, "upsertas", UPSERT_AS, "insert-delete"),
        schema_ddl=opts.get("schema") or None,
    )
    for key, attr in (("schemaScanMessages", "schema_scan_messages"), ("schemaLookback", "schema_lookback")):
        scan = str(opts.get(key.lower()) or "").strip()
        if scan:
            if not scan.isdigit():
                raise OptionError(f"option {key} must be an integer >= 0 (0: no bound), got {scan!r}")
            setattr(r, attr, int(scan))
    r.milvus_named = cfg.is_set("milvus.address") and bool(cfg.get_str("milvus.address").strip())
    r.message_types = _message_types(opts, r.output) or r.message_types
    r.read_timeout = _read_timeout(opts) or r.read_timeout
    r.batch_rows = _pos_int(opts, "maxbatchrows") or r.batch_rows
    if r.output == "collections" and (r.collection or r.schema_ddl or r.upsert_as != "insert-delete"):
        raise OptionError("output=collections reads every collection with the schema its messages carry: options "
                          "collection, schema and upsertAs=update do not apply to it")
    if r.min_rows and r.max_rows and r.min_rows > r.max_rows:
        raise OptionError(f"option minRowsPerTrigger ({r.min_rows}) must not exceed maxRowsPerTrigger ({r.max_rows})")
    if starting and r.starting_ts is not None:
        raise OptionError("set only one of startingPositions and startingTimestamp")
    if ending and r.ending_ts is not None:
        raise OptionError("set only one of endingPositions and endingTimestamp")
    if streaming is not None:  # None: schema(), the mode is not known yet
        _check_mode(r, opts, streaming)
    return r


def _channels(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """(channels, channelPattern): exactly one of them, no channel twice, a valid regex."""
    channels = tuple(c.strip() for c in (opts.get("channels") or opts.get("path") or "").split(",") if c.strip())
    pattern = opts.get("channelpattern") or None
    if bool(channels) == bool(pattern):
        raise OptionError("exactly one of the options channels or channelPattern must be set "
                          f"(channels={opts.get('channels')!r}, channelPattern={pattern!r})")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option channelPattern is not a valid regex: {exc}") from None
    if len(set(channels)) != len(channels):
        raise OptionError(f"option channels lists a channel twice: {opts.get('channels')}")
    return channels, pattern


def _message_types(opts: Mapping[str, str], output: str) -> tuple[str, ...] | None:
    types = opts.get("messagetypes")
    if not types:
        return None
    parsed = tuple(t.strip().lower() for t in types.split(",") if t.strip())
    bad = [t for t in parsed if t not in MESSAGE_TYPES]
    if bad:
        raise OptionError(f"option messageTypes has unknown type(s) {', '.join(bad)}; "
                          f"accepted: {', '.join(MESSAGE_TYPES)}")
    if output == "rows" and not set(parsed) & set(ROW_TYPES):
        raise OptionError("option messageTypes must include insert or delete with output=rows "
                          "(other types produce no rows; use output=messages)")
    return parsed


def _read_timeout(opts: Mapping[str, str]) -> float | None:
    rt = opts.get("readtimeout")
    if not rt:
        return None
    try:
        value = float(rt)
    except ValueError:
        value = 0.0
    if not value > 0:  # also rejects NaN
        raise OptionError(f"option readTimeout must be a positive number of seconds, got {rt!r}")
    return value


def _check_mode(r: ReadOptions, opts: Mapping[str, str], streaming: bool) -> None:
    """Options that only one of spark.read / spark.readStream accepts."""
    starting, ending = r.starting, r.ending
    if streaming:
        for key, val in (("endingPositions", ending), ("endingTimestamp", r.ending_ts)):
            if val is not None:
                raise OptionError(f"option {key} is for batch reads only (spark.read), not for readStream")
        if not r.subscription:
            raise OptionError("option subscription is required for readStream: it names where the query's "
                              "start positions and progress are recorded in the backend")
    else:
        if starting and starting.strip().lower() == "latest":
            raise OptionError("option startingPositions=latest is not allowed for batch reads (nothing to read)")
        for key in ("maxrowspertrigger", "maxbytespertrigger", "minrowspertrigger"):
            if opts.get(key):
                log.warning("option %s only applies to streaming reads; ignored for spark.read", key)
