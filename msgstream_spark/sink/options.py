"""Options of the ``msgstream`` sink, parsed and validated on the driver.

Everything here is plain data (Spark pickles it into every write task). Parsing is
strict: an unknown value names the option and what it accepts.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.errors import OptionError
from msgstream_spark.stream.names import looks_like_milvus_dml

log = logging.getLogger(__name__)

# A task validates and encodes this much before producing. Small enough that a Spark task's first produce
# starts while Spark still hands it the next Arrow batches (a 16 MiB buffer held a 25k-row task of 128-d
# vectors until its input ended: docs/benchmarks.md), large enough for few backend round trips.
DEFAULT_BUFFER_BYTES = 4 * 1024 * 1024
# Option names that are passed to the config loader (``.option("kafka.brokerList", ...)``).
CONFIG_PREFIXES = ("mq.", "local.", "kafka.", "pulsar.", "msgstream.", "msgchannel.", "rootcoord.")
# Columns the msgstream reader adds; the sink ignores them so a read DataFrame can be written back.
METADATA_COLUMNS = frozenset({"_channel", "_shard", "_collection", "_partition", "_ts", "_event_time",
                              "_msg_id", "_position", "_msg_type", "_seq"})
OP_COLUMN = "op"

SINK_OPTIONS = ("config", "channels", "collection", "collectionID", "partition", "partitionID",
                "dbName", "primaryKey", "shardsNum", "maxMessageSize", "fieldTypes", "writerId",
                "timeTick", "bufferBytes", "sourceID", "wireFormat", "transactional", "txnKeepalive")
WIRE_FORMATS = ("2.5", "2.6")
DEFAULT_TXN_KEEPALIVE_MS = 10_000  # Milvus's streamingnode default

# Options Spark itself passes to a sink (ignored).
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


def stable_id(*parts: str, bits: int = 62) -> int:
    """A positive integer derived from ``parts`` (same input, same id, on every machine)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << bits) - 1)) or 1


def _int(opts: Mapping[str, str], name: str, default: int | None, minimum: int | None = None) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _config_max_size(cfg: Config) -> int:
    """The insert split size when option maxMessageSize is not given: ``pulsar.maxMessageSize``, as Milvus."""
    size = cfg.get_int("pulsar.maxmessagesize")
    if size < 1024:
        raise OptionError(f"config key pulsar.maxMessageSize={size} is below 1024 bytes, too small to split inserts "
                          f"into ({cfg.source}); raise it or set option maxMessageSize")
    return size


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    s = str(raw).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


def _time_tick(raw: str | None) -> str:
    s = (raw or "all").strip().lower()
    s = {"true": "all", "false": "none", "yes": "all", "no": "none"}.get(s, s)
    if s not in ("all", "written", "none"):
        raise OptionError(f"option timeTick must be all, written or none, got {raw!r}")
    return s


def _wire_format(raw: str | None) -> str:
    s = (raw or "2.5").strip()
    if s not in WIRE_FORMATS:
        raise OptionError(f"option wireFormat must be 2.5 (Milvus 2.5 msgstream messages) or 2.6 (Milvus 2.6 "
                          f"streaming-WAL messages), got {raw!r}")
    return s


def _wire_options(opts: Mapping[str, str]) -> dict[str, Any]:
    """wireFormat, transactional and txnKeepalive; transactions exist only in the 2.6 format."""
    wire_format = _wire_format(opts.get("wireformat"))
    transactional = _bool(opts, "transactional", False)
    keepalive = _int(opts, "txnKeepalive", DEFAULT_TXN_KEEPALIVE_MS, minimum=1)
    if transactional and wire_format != "2.6":
        raise OptionError(f"option transactional=true needs wireFormat=2.6 (Milvus 2.5 messages have no "
                          f"transactions), got wireFormat={wire_format}")
    if "txnkeepalive" in opts and not transactional:
        raise OptionError("option txnKeepalive applies only with transactional=true")
    return {"wire_format": wire_format, "transactional": transactional,
            "txn_keepalive_ms": int(keepalive or DEFAULT_TXN_KEEPALIVE_MS)}


def parse_field_types(text: str | None) -> tuple[dict[str, str], dict[str, int]]:
    """``"emb:Float16Vector(128),tags:Array"`` -> (types by column, dims by column)."""

    types: dict[str, str] = {}
    dims: dict[str, int] = {}
    if not text:
        return types, dims
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r"([^:]+):\s*([A-Za-z0-9]+)\s*(?:\(\s*(\d+)\s*\))?", item)
        if not m:
            raise OptionError(f"option fieldTypes: expected column:MilvusType or column:MilvusType(dim) pairs, "
                              f"got {item!r}")
        name, typ, dim = m.group(1).strip(), m.group(2), m.group(3)
        types[name] = typ
        if dim:
            dims[name] = int(dim)
    return types, dims


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options after parsing (plain data)."""

    config_path: str | None
    config_overrides: dict[str, Any] = field(repr=False)
    channels: tuple[str, ...]
    collection: str
    collection_id: int
    partition: str
    partition_id: int
    db_name: str
    primary_key: str | None
    max_message_size: int
    field_types: dict[str, str] = field(default_factory=dict)
    field_dims: dict[str, int] = field(default_factory=dict)
    writer_id: str = ""
    writer_id_explicit: bool = False
    time_tick: str = "all"  # all: tick every sink channel; written: only channels written; none
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    source_id: int = 0
    wire_format: str = "2.5"  # 2.5: msgstream messages; 2.6: streaming-WAL messages (properties, _h, _tt)
    transactional: bool = False  # 2.6 only: per task and channel BeginTxn, bodies, CommitTxn / RollbackTxn
    txn_keepalive_ms: int = DEFAULT_TXN_KEEPALIVE_MS
    config_values: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold secrets
    config_source: str = ""

    @property
    def vchannels(self) -> tuple[str, ...]:
        """``<pchannel>_<collectionID>v<shard>`` for every shard (wire doc §10.1)."""
        return tuple(f"{ch}_{self.collection_id}v{i}" for i, ch in enumerate(self.channels))

    def load_config(self):
        """The backend configuration, loaded on the driver (executors need no config file)."""

        if self.config_values:
            return Config(dict(self.config_values), self.config_source)
        return Config.load(self.config_path, overrides=self.config_overrides or None)


def parse_sink_options(options: Mapping[str, Any], *, streaming: bool = False) -> SinkOptions:
    """Parse and validate the sink options (keys are case-insensitive)."""
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in options.items()}
    known = {o.lower() for o in SINK_OPTIONS} | SPARK_OPTIONS
    overrides = {k: v for k, v in opts.items() if k.startswith(CONFIG_PREFIXES)}
    unknown = sorted(k for k in opts if k not in known and k not in overrides)
    if unknown:
        raise OptionError(f"unknown msgstream sink option(s): {', '.join(unknown)}; valid options: "
                          f"{', '.join(SINK_OPTIONS)} and config keys ({', '.join(CONFIG_PREFIXES)}...)")
    config_path = opts.get("config") or None
    shards = _int(opts, "shardsNum", None, minimum=1)

    cfg = Config.load(config_path, overrides=overrides or None)
    cfg.mq_type  # noqa: B018 - fail here, on the driver, when no backend is configured
    channels = tuple(c.strip() for c in opts.get("channels", "").split(",") if c.strip())
    if not channels:
        channels = tuple(cfg.dml_channel_names(shards or 1))
    if len(set(channels)) != len(channels):
        raise OptionError(f"option channels lists a channel twice: {','.join(channels)}")
    if shards is not None and shards != len(channels):
        raise OptionError(f"option shardsNum={shards} does not match the {len(channels)} channel(s) given in "
                          f"option channels ({','.join(channels)}): shard i is written to channel i")
    for ch in channels:
        if "-partition-" in ch:
            raise OptionError(f"option channels: channel name {ch!r} must not contain '-partition-' "
                              "(Milvus rejects it because of a Pulsar client bug)")
    collection = opts.get("collection") or "msgstream"
    partition = opts.get("partition") or "_default"
    coll_id = _int(opts, "collectionID", None, minimum=1) or stable_id("collection", collection)
    part_id = _int(opts, "partitionID", None, minimum=1) or stable_id("partition", str(coll_id), partition)
    field_types, field_dims = parse_field_types(opts.get("fieldtypes"))
    max_size = _int(opts, "maxMessageSize", None, minimum=1024) or _config_max_size(cfg)
    writer_id = opts.get("writerid") or uuid.uuid4().hex
    if "," in writer_id or "=" in writer_id:
        raise OptionError(f"option writerId must not contain ',' or '=', got {writer_id!r}")
    parsed = SinkOptions(
        config_path=config_path,
        config_overrides=overrides,
        channels=channels,
        collection=collection,
        collection_id=int(coll_id),
        partition=partition,
        partition_id=int(part_id),
        db_name=opts.get("dbname", ""),
        primary_key=opts.get("primarykey") or None,
        max_message_size=int(max_size),
        field_types=field_types,
        field_dims=field_dims,
        writer_id=writer_id,
        writer_id_explicit=bool(opts.get("writerid")),
        time_tick=_time_tick(opts.get("timetick")),
        buffer_bytes=int(_int(opts, "bufferBytes", DEFAULT_BUFFER_BYTES, minimum=1) or DEFAULT_BUFFER_BYTES),
        source_id=int(_int(opts, "sourceID", 0, minimum=0) or 0),
        **_wire_options(opts),
        config_values=dict(cfg.values),
        config_source=cfg.source,
    )
    warn_if_live_milvus(parsed.channels)
    return parsed


LIVE_MILVUS_WARNING = (
    "msgstream sink: channel(s) {names} look like a Milvus cluster's DML channels. Writing into a "
    "running Milvus's channels can corrupt or stall it: Milvus expects timestamps from its RootCoord "
    "TSO below its next time tick, segment ids from DataCoord and msgIDs from its allocator (wire doc "
    "§14 item 5). Write to channels this project owns."
)


def warn_if_live_milvus(channels: tuple[str, ...] | list[str]) -> bool:
    """Warn (``warnings``, shown once on stderr) when channel names look like a live Milvus's DML channels."""

    hits = [c for c in channels if looks_like_milvus_dml(c)]
    if not hits:
        return False
    warnings.warn(LIVE_MILVUS_WARNING.format(names=", ".join(hits)), UserWarning, stacklevel=3)
    return True
