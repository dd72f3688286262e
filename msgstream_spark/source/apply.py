"""What a read task does with each message of its range, for both wire formats (2.5 and 2.6).

``rows`` output goes through the stream layer's :class:`~msgstream_spark.stream.decode.ChannelDecoder`:
transaction bodies come out at their commit (rolled back or expired ones never), 2.6 inserts
and deletes are rebuilt from their properties, and only row-bearing messages become rows
(never version-2, DDL or control-vchannel messages). An AlterCollection that adds a field the
query's schema lacks follows ``onSchemaChange``. ``messages`` output shows every message as
it is on the broker, one row each, in broker order.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from msgstream_spark.errors import DecodeError, SchemaError, UnknownMessageTypeError
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.msg.types import MsgType
from msgstream_spark.msg.wal26 import WalMessageType, WalMsg, decode_message, parse_envelope, time_tick_of
from msgstream_spark.source import multi
from msgstream_spark.source.offsets import b64
from msgstream_spark.source.rows import METADATA, OP, wanted_type
from msgstream_spark.stream.decode import ChannelDecoder
from msgstream_spark.stream.seek import SeekFilter

log = logging.getLogger(__name__)

COLLECTION_META = "msgstream.collectionId"
_SCHEMA_TYPES = (WalMessageType.AlterCollection, WalMessageType.SchemaChange)
_TXN_END = (WalMessageType.CommitTxn, WalMessageType.RollbackTxn)
_MANY_WAL_DDL = (*_SCHEMA_TYPES, WalMessageType.TruncateCollection)  # the WalMsg DDL output=collections shows


def decode_failed(exc: DecodeError, opts: Any, builder: Any, m: Any) -> None:
    """``onDecodeError``: fail naming channel and position, or log and skip (shown raw in messages)."""
    if opts.on_decode_error == "fail":
        raise DecodeError(f"{exc.reason} (set onDecodeError=skip to skip such messages)", channel=exc.channel,
                          msg_id=exc.msg_id, payload=exc.payload) from exc
    log.warning("skipping undecodable message (onDecodeError=skip): %s", exc)
    if opts.output == "messages":
        builder.add_raw(m, None)


def collection_matches(msg: Any, part: Any) -> bool:
    if part.collection_id is None and part.collection_name is None:
        return True
    if msg.msg_type not in (MsgType.Insert, MsgType.Delete):
        return True
    if part.collection_id is not None and msg.collection_id == part.collection_id:
        return True
    return part.collection_name is not None and msg.proto.collection_name == part.collection_name


def _query_fields(schema_json: str) -> tuple[set[str], int | None]:
    """(collection field names of the query's schema, the inferred collection id if recorded)."""
    fields = json.loads(schema_json).get("fields", [])
    names = {f["name"] for f in fields if f["name"] != OP and f["name"] not in METADATA}
    cid = next(((f.get("metadata") or {}).get(COLLECTION_META) for f in fields if f["name"] == OP), None)
    return names, cid


def txn_event(props: Any) -> tuple[int, int] | None:
    """(``_t``, txn id) of a message inside a 2.6 transaction, else None (only ``_tx`` is parsed)."""
    if not props or "_tx" not in props:
        return None
    try:
        env = parse_envelope(props)
    except DecodeError:
        return None
    return (env.msg_type, env.txn_id) if env.txn is not None else None


class RowsHandler:
    """Per read task: the channel decoder, the filters, and the rows builder."""

    def __init__(self, part: Any, builder: Any, dedupe: Any, wal: Any, start_ts: int | None) -> None:
        self.part = part
        self.opts = part.opts
        self.builder = builder
        self.dedupe = dedupe
        self.many = self.opts.output == "collections"
        # rows output converts inserts through InsertMsg.field_arrays: float vectors are viewed in the payload
        self.decoder = ChannelDecoder(part.channel, wal, start_ts=start_ts, group=self.opts.subscription,
                                      last_tick=part.start.get("tick"),  # a cut piece: the tick before it
                                      float_views=not self.many)
        self.fields, self.inferred_cid = _query_fields(part.schema_json)
        self.open_txns: set[int] = set()  # begun and not ended, as seen on the broker
        self.keep_only: set[int] | None = None  # past the range end: only these transactions' rows

    def handle(self, m: Any) -> None:
        """Feed one broker message; add the rows it releases."""
        ev = txn_event(m.properties)
        if ev is not None and ev[0] == WalMessageType.BeginTxn:
            self.open_txns.add(ev[1])
        elif ev is not None and ev[0] in _TXN_END:
            self.open_txns.discard(ev[1])
        if self.dedupe is not None and not self.dedupe.keep(self.part.channel, m.properties):
            return
        try:
            released = self.decoder.feed(m)
        except UnknownMessageTypeError:
            return  # a type this library does not decode never becomes rows
        except DecodeError as exc:
            return decode_failed(exc.with_location(self.part.channel, m.id.serialize()), self.opts, self.builder, m)
        for d in released:
            if self.keep_only is None or d.txn_id in self.keep_only:
                self._apply(d)

    def needs_more(self) -> bool:
        """At or past the range end: whether a transaction begun in the range is still open."""
        if self.keep_only is None:
            self.keep_only = set(self.open_txns)
        if not self.keep_only & self.open_txns or not self.decoder.has_open:
            return False
        return any(t.txn_id in self.keep_only for t in self.decoder.txn.open_transactions())  # not expired

    def _apply(self, d: Any) -> None:
        msg = d.msg
        if self.many:  # output=collections: every collection's rows, its creation, schema changes and drop
            if msg.msg_type in (MsgType.CreateCollection, MsgType.DropCollection, MsgType.DropPartition) or (
                    isinstance(msg, WalMsg) and msg.wal_type in _MANY_WAL_DDL):
                self.builder.ddl(msg)
            elif d.row_bearing and wanted_type(msg.msg_type, self.opts.message_types):
                self.builder.add(msg, self.part.channel, d.raw.id.serialize(), d.position if d.version else None)
            return
        if self.opts.removal_rows and self._removal(d):
            return
        if isinstance(msg, WalMsg):
            if msg.wal_type in _SCHEMA_TYPES:
                self._schema_change(d)
            return
        if not d.row_bearing or not wanted_type(msg.msg_type, self.opts.message_types):
            return
        if not collection_matches(msg, self.part):
            return
        self.builder.add(msg, self.part.channel, d.raw.id.serialize(), d.position if d.version else None)

    def _removal(self, d: Any) -> bool:
        """``removalRows``: a DropPartition / TruncateCollection copy of the query's collection as one row
        (``source.multi.removal`` decides, as for ``output=collections``); True when ``d`` is such a message."""
        msg = d.msg
        got = multi.removal(msg)
        if got is None:
            return False
        name = getattr(getattr(msg, "proto", None), "collection_name", "") or ""
        if self._removal_ours(msg.collection_id, name):
            kind, pid, shards = got
            self.builder.removal(msg, kind, pid if kind == multi.KIND_DROP_PARTITION else shards,
                                 multi.ddl_shard(msg), self.part.channel, d.raw.id.serialize())
        return True

    def _removal_ours(self, cid: int, name: str) -> bool:
        """Whether a removal is of the query's collection: by id where the query knows it (a Truncate names no
        collection, a 2.3-2.6.5 DropPartition may not), else by name."""
        part = self.part
        if part.collection_id is not None:
            return cid == part.collection_id
        if self.inferred_cid is not None:
            return cid == int(self.inferred_cid)
        return part.collection_name is None or name == part.collection_name

    def _schema_change(self, d: Any) -> None:
        """An AlterCollection adding fields the query lacks: ``onSchemaChange`` fail or ignore."""
        msg, part = d.msg, self.part
        mid = d.raw.id.serialize()
        try:
            new = msg.schema
        except DecodeError as exc:
            return decode_failed(exc.with_location(part.channel, mid), self.opts, self.builder, d.raw)
        if new is None or not self._ours(msg.collection_id, new.name):
            return
        names = collection_arrow_schema(new).names
        added = [n for n in names if n not in self.fields]
        head = (f"collection {new.name or '?'} (id {msg.collection_id}): {msg.wal.type_name} on channel "
                f"{part.channel} at position msgID(base64)={b64(mid)} (_tt {d.time_tick})")
        dropped = sorted(self.fields.difference(names))
        if dropped:  # 3.0 drops fields: later inserts lack them, their columns are null
            log.warning("%s drops field(s) %s; their columns are null in the rows written after it", head,
                        ", ".join(dropped))
        if not added:
            return
        where = f"{head} adds field(s) {', '.join(added)}"
        if self.opts.on_schema_change == "ignore":
            log.warning("%s; not in this query's schema, dropped from its rows (onSchemaChange=ignore)", where)
            return
        raise SchemaError(f"{where}, which this query's schema does not have; start a new query (it infers the "
                          "altered schema) or set onSchemaChange=ignore to drop fields outside the query's schema")

    def _ours(self, cid: int, name: str) -> bool:
        part = self.part
        if part.collection_id is not None:
            return cid == part.collection_id
        if part.collection_name is not None:
            return name == part.collection_name
        return self.inferred_cid is None or cid == self.inferred_cid


def _type_wanted(msg: Any, message_types: tuple[str, ...] | None) -> bool:
    if msg.wal is None:
        return wanted_type(msg.msg_type, message_types)
    return message_types is None or msg.wal.type_name.lower() in message_types


def handle_message(m: Any, part: Any, builder: Any, dedupe: Any, seek: SeekFilter) -> None:
    """``messages`` output: one row per broker message (2.5 or 2.6), filtered by seek, type, collection."""
    opts = part.opts
    if dedupe is not None and not dedupe.keep(part.channel, m.properties):
        return
    mid = m.id.serialize()
    try:
        msg = decode_message(m.payload, m.properties, channel=part.channel, msg_id=mid)
    except UnknownMessageTypeError:
        if opts.message_types is None:
            builder.add_raw(m, None)  # tooling output keeps types we do not decode
        return
    except DecodeError as exc:
        return decode_failed(exc.with_location(part.channel, mid), opts, builder, m)
    tick = (msg.wal.msg_type == WalMessageType.TimeTick) if msg.wal is not None else msg.msg_type == MsgType.TimeTick
    if seek.active and not seek.keep(tick, time_tick_of(msg)):
        return
    if _type_wanted(msg, opts.message_types) and collection_matches(msg, part):
        builder.add_raw(m, msg)
