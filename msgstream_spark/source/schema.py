"""The source's schema: fixed for ``messages``, inferred or given for ``rows``.

Inference reads the channels from their first message until it finds, for the wanted
collection, a CreateCollection message (the authoritative schema) or a first insert. Each
channel is read up to its latest message as of the scan's start, and only messages that may
tell a schema are decoded (an insert's collection is read from its top-level fields first).
A first scan of a long channel whose ids are offsets reads only its newest messages, within a
budget (:mod:`msgstream_spark.source.tailscan`); a later one only what was appended
(:mod:`msgstream_spark.source.scancache`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import DecodeError, SchemaError, UnknownMessageTypeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.schema import collection_arrow_schema, infer_collection_schema
from msgstream_spark.msg.types import MsgType
from msgstream_spark.msg.wal26 import WalMessageType, decode_message, is_wal_message
from msgstream_spark.msg.wire import iter_fields
from msgstream_spark.source import scancache, tailscan
from msgstream_spark.source.multi import collections_arrow_schema
from msgstream_spark.source.offsets import b64
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.source.rows import METADATA, OP, messages_arrow_schema, rows_arrow_schema
from msgstream_spark.source.schema_ask import described as _described
from msgstream_spark.source.schema_ask import not_found as _not_found

log = logging.getLogger(__name__)

INFER_MAX_MESSAGES = 100_000
INFER_SECONDS = 30.0
WAL_VERSION, WAL_TYPE = "_v", "_t"  # 2.6 envelope properties: wire version, message type
_WAL_SCHEMA_TYPES = frozenset((WalMessageType.CreateCollection, WalMessageType.AlterCollection,
                               WalMessageType.SchemaChange))


def _matches(opts: ReadOptions, cid: int, name: str) -> bool:
    if getattr(opts, "wanted", None) is not None:  # several collections by id (``source.schema_many``)
        return cid in opts.wanted
    want = opts.collection
    return want is None or want == str(cid) or want == name


def _all_found(opts: ReadOptions, found: dict) -> bool:
    """Whether ``found`` holds every collection the scan wants (one by id, or each of ``wanted``'s ids)."""
    if getattr(opts, "wanted", None) is not None:
        return opts.wanted <= found.keys()
    return bool(found) and opts.collection is not None and opts.collection.isdigit()


def _scan_schemas(opts: ReadOptions, channels: list[str], shared: Any = None,
                  looked: dict[str, str] | None = None) -> tuple[dict[int, tuple[Any, str]], dict[int, int]]:
    """({collection id: (CollectionSchema, source)}, {collection id: creation time}) found in the
    channels' CreateCollection messages (else their first insert), within the inference budget.

    On a channel with 2.6 messages the scan goes on after the CreateCollection, so that a later
    AlterCollection's schema wins (a new query infers the altered schema). What an earlier scan of the
    same channels read is not read again (:mod:`msgstream_spark.source.scancache`). ``shared``: a client
    to use (the caller closes it), else one of its own. ``looked``: filled with what was read per channel."""
    client = shared or opts.client()
    deadline = time.monotonic() + INFER_SECONDS
    key = scancache.state_key(opts.collection, channels)
    looked = {} if looked is None else looked
    try:
        state = scancache.load(client, key)
        lasts = {ch: client.latest_message_id(ch) for ch in channels}  # the scan ends there: later ones do not count
        if any(after is not None and lasts.get(ch) is not None and client.bytes_to_message_id(after) > lasts[ch]
               for ch, after in state.upto.items()):
            log.info("a channel is behind the stored schema scan (deleted and re-created?): scanning from the start")
            state = scancache.ScanState()
        before = dict(state.upto)
        for ch in channels:
            last = lasts[ch]
            after = state.upto.get(ch)
            if last is None or after is not None and not client.bytes_to_message_id(after) < last:
                looked[ch] = "none (empty)" if last is None else "none appended since the stored scan"
                continue
            if after is None and _scan_bounded(opts, client, ch, last, state, deadline, looked):
                continue  # a first scan of a long channel: its newest messages only
            looked[ch] = "every message" if after is None else "the messages appended since the stored scan"
            cons = client.reader(ch)
            try:
                if after is None:
                    cons.seek(client.earliest_message_id(), inclusive=True)
                else:
                    cons.seek(client.bytes_to_message_id(after), inclusive=False)
                stop = _scan_channel(opts, ch, cons, last, deadline, (state.found, state.created, state.broadcasts))
                if stop is not None:
                    state.upto[ch] = stop.serialize()
            finally:
                cons.unsubscribe()  # a throwaway inference subscription
        if state.upto != before:
            scancache.save(client, key, state)
    finally:
        if shared is None:
            client.close()
    return state.found, state.created


def _scan_bounded(opts: ReadOptions, client: Any, ch: str, last: Any, state: scancache.ScanState,
                  deadline: float, looked: dict[str, str]) -> bool:
    """A first scan of a long channel (ids that are offsets, or Pulsar's within a ledger): its newest
    ``schemaScanMessages`` messages, then further back up to ``schemaLookback`` while they tell nothing of the
    wanted collection (:func:`~msgstream_spark.source.tailscan.look_back`). False where it does not apply."""
    budget = opts.schema_scan_messages
    bounded = tailscan.span(client, ch, last, budget)
    start = tailscan.start_before(client, ch, last, budget) if bounded is None else None
    if bounded is None and start is None:
        return False
    feed = lambda c, b, n: _feed(opts, c, b, n)  # noqa: E731
    limit = opts.schema_lookback
    if bounded and getattr(opts, "wanted", None) is not None:  # each wanted collection's newest window
        notes, fetched = tailscan.look_back_each(client, ch, bounded, budget, limit, feed, deadline, opts.wanted)
    elif bounded:
        notes, fetched = tailscan.look_back(client, ch, bounded, budget, limit, feed, deadline)
    else:
        notes, fetched, outgrown = tailscan.look_back_from(client, ch, start, last, budget, limit, feed, deadline)
        if outgrown:
            return False  # older messages lie in an earlier Pulsar ledger: read the channel from its first one
    _merge_tail(ch, state, notes, fetched)
    looked[ch] = f"the newest {fetched} messages" + ("" if bounded else " (inside the last message's Pulsar ledger)")
    if notes[0] and (getattr(opts, "wanted", None) is None or _all_found(opts, notes[0])):
        state.upto[ch] = last.serialize()  # found: a later scan reads only what is appended (else: looks back)
    return True


def _scan_channel(opts: ReadOptions, ch: str, cons: Any, last: Any, deadline: float,
                  state: tuple[dict, dict, set]) -> Any:
    """Feed one channel's messages up to ``last`` (its latest id when the scan began) to the notes;
    the id of the last message fed (None: none)."""
    found = state[0]
    seen = 0
    stop = None
    while seen < INFER_MAX_MESSAGES and time.monotonic() < deadline:
        batch = cons.receive_batch(1024, 0.2)
        if not batch:  # ``last`` exists but has not come yet (a slow first fetch): wait, within the budget
            continue
        seen += len(batch)
        at_end = not batch[-1].id < last
        if at_end:  # reached the channel's end as of the scan's start: nothing after it counts
            batch = [m for m in batch if not last < m.id]
        wal = _feed(opts, ch, batch, state)
        if batch:
            stop = batch[-1].id
        if at_end:
            return stop  # no wait for more at the end
        if not wal and _all_found(opts, found):
            # 2.5 messages cannot change an id's schema (its CreateCollection precedes its inserts): when the
            # channel's last message is a 2.5 one too, the scan counts as done up to it (a later plan reads only
            # what comes after); else (2.6 messages after, an AlterCollection maybe) later plans read on from here
            return last if tailscan.ends_in_25(cons, last) else stop
    return stop


def _feed(opts: ReadOptions, ch: str, batch: list, state: tuple) -> bool:
    """Note what each message of ``batch`` tells; whether any was a 2.6 message."""
    wal = False
    for m in batch:
        if is_wal_message(m.properties):  # not a version-0 entry (a 2.5 body behind rebuilt properties)
            wal = True
            _note_wal_schema(opts, ch, m, state)
        else:
            _note_schema(opts, ch, m, state[0], state[1])
    return wal


def _merge_tail(ch: str, state: scancache.ScanState, notes: tailscan.Notes, fetched: int) -> None:
    """Add what a bounded scan of ``ch`` found: per collection, a schema message over inserts, else the newer."""
    found, created, seen, stamps = notes
    state.broadcasts |= seen
    for cid, (schema, src) in found.items():
        old = state.found.get(cid)
        newer = stamps.get(cid, created.get(cid, 0)) >= state.created.get(cid, 0)
        if old is None or old[1] == "Insert" and src != "Insert" or src != "Insert" and newer:
            state.found[cid] = (schema, src)
            state.created[cid] = stamps.get(cid, created.get(cid, 0))
    if found and all(src == "Insert" for _, src in found.values()):
        log.info("channel %s: no schema message in its newest %d messages; the schema is inferred from inserts "
                 "(set option schema for nullability, defaults and function outputs)", ch, fetched)


def _insert_collection(payload: bytes) -> tuple[int, str] | None:
    """(collectionID, collection_name) of an InsertRequest read from its top-level fields only,
    skipping the row data; ``None`` when the bytes do not read (the full decode then decides). The walk
    ends after field 7: encoders write fields in number order (name = 4, collectionID = 7)."""
    cid, name = 0, ""
    try:
        for field_no, wire, value, start in iter_fields(payload):
            if field_no > 7 and cid:
                break
            if field_no == 7 and wire == 0:
                cid = value - (1 << 64) if value >= 1 << 63 else value
            elif field_no == 4 and wire == 2:
                name = bytes(payload[start:start + value]).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return cid, name


def _known_insert(opts: ReadOptions, payload: bytes, found: dict) -> bool:
    """True when an insert adds nothing: another collection's, or of one whose schema is known."""
    peek = _insert_collection(payload)
    if peek is None:
        return False
    cid, name = peek
    return cid in found or not _matches(opts, cid, name)


def _skipped(ch: str, m: Any, exc: DecodeError) -> None:
    """An undecodable message tells no schema: logged with its channel and position, then skipped."""
    level = logging.DEBUG if isinstance(exc, UnknownMessageTypeError) else logging.WARNING
    log.log(level, "schema inference skips the message at channel %s msgID(base64)=%s: %s", ch,
            b64(m.id.serialize()), exc.reason)


def _note_schema(opts: ReadOptions, ch: str, m: Any, found: dict, created: dict) -> None:
    """Record the schema one raw message tells (a CreateCollection wins over an insert)."""
    try:
        t = codec.peek_msg_type(m.payload, m.properties)
    except DecodeError as exc:  # a corrupt message does not stop inference (a codec bug does)
        return _skipped(ch, m, exc)
    if t not in (MsgType.CreateCollection, MsgType.Insert):
        return
    if t == MsgType.Insert and _known_insert(opts, m.payload, found):
        return  # no need to decode its rows
    try:
        msg = codec.unmarshal(m.payload, m.properties, channel=ch)
    except DecodeError as exc:
        return _skipped(ch, m, exc)
    name = getattr(msg.proto, "collectionName", "") or getattr(msg.proto, "collection_name", "")
    cid = msg.collection_id
    if not _matches(opts, cid, name):
        return
    if t == MsgType.CreateCollection and msg.schema is not None:
        found[cid] = (msg.schema, "CreateCollection")
        created[cid] = msg.timestamp
    elif cid not in found:
        found[cid] = (infer_collection_schema(msg.proto, name), "Insert")
        created.setdefault(cid, msg.begin_ts)


def _broadcast_key(env: Any, cid: int) -> tuple | None:
    """One key per broadcast DDL: ``_bh``'s id, else (early 2.6.x: ``_btt``, no ``_bh``) collection + barrier."""
    if env.broadcast_id is not None:
        return ("bh", env.broadcast_id)
    if env.barrier_time_tick is not None:
        return ("btt", cid, env.barrier_time_tick)
    return None


def _wal_wanted(opts: ReadOptions, m: Any, found: dict) -> bool:
    """Whether a 2.6 message (``is_wal_message``) may tell a schema, judged from ``_t`` (and a v1 insert's top
    fields); a version-0 entry's ``_t`` never comes here (it is read as the 2.5 message it is)."""
    try:
        t = int(m.properties.get(WAL_TYPE, ""))
    except ValueError:
        return True  # the decode reports what is wrong (and inference skips it)
    if t in _WAL_SCHEMA_TYPES:
        return True
    if t != WalMessageType.Insert:
        return False
    return m.properties.get(WAL_VERSION) != "1" or not _known_insert(opts, m.payload, found)


def _note_wal_schema(opts: ReadOptions, ch: str, m: Any, state: tuple[dict, dict, set]) -> None:
    """The schema a 2.6 message tells: CreateCollection (each broadcast once), AlterCollection, Insert."""
    found, created, seen = state[:3]
    if not _wal_wanted(opts, m, found):
        return
    try:
        msg = decode_message(m.payload, m.properties, channel=ch)
        t = msg.wal.msg_type
        if t in (WalMessageType.AlterCollection, WalMessageType.SchemaChange):
            schema = msg.schema
            name = schema.name if schema is not None else ""
        elif t == WalMessageType.CreateCollection:
            schema, name = msg.schema, msg.proto.collectionName
        elif t == WalMessageType.Insert:
            schema, name = None, msg.proto.collection_name
        else:
            return
    except DecodeError as exc:  # a corrupt message does not stop inference (a codec bug does)
        return _skipped(ch, m, exc)
    cid = msg.collection_id
    if schema is None and t != WalMessageType.Insert or not _matches(opts, cid, name):
        return
    if t == WalMessageType.CreateCollection:
        key = _broadcast_key(msg.wal, cid)
        if key is not None and key in seen:
            return  # another vchannel's copy of the same broadcast
        seen.add(key)
        found[cid] = (schema, "CreateCollection")
        created[cid] = msg.wal.time_tick
        if len(state) > 3:
            state[3][cid] = msg.wal.time_tick
    elif t != WalMessageType.Insert:
        if cid in found or len(state) > 3:  # a bounded scan's window may not reach back to the create
            found[cid] = (schema, msg.wal.type_name)
            if len(state) > 3:
                state[3][cid] = msg.wal.time_tick
    elif cid not in found:
        found[cid] = (infer_collection_schema(msg.proto, name), "Insert")
        created.setdefault(cid, msg.wal.time_tick)


def infer_collection(opts: ReadOptions, channels: list[str]) -> tuple[Any, int]:
    """(CollectionSchema, collection id) of the collection ``opts`` reads: as Milvus describes it (the ``milvus``
    backend, or ``milvus.address`` given), else from the channels' messages; SchemaError if nothing is found."""
    client = opts.client()
    looked: dict[str, str] = {}
    failures: list[str] = []
    try:
        described = _described(opts, client, failures)
        if described is not None:
            log.info("the schema of collection %s is the one DescribeCollection gives", described[1])
            return described
        found, created = _scan_schemas(opts, channels, client, looked)
    finally:
        client.close()
    if not found:
        raise _not_found(opts, channels, looked, failures)
    if len(found) > 1 and opts.collection is not None and not opts.collection.isdigit():
        # dropped and re-created under the same name: the newest incarnation's schema
        newest = max(found, key=lambda c: created.get(c, 0))
        log.info("collection %r: ids %s share the name; using the newest, %s", opts.collection,
                 sorted(found), newest)
        found = {newest: found[newest]}
    if len(found) > 1:
        raise SchemaError(f"channels {', '.join(channels)} carry several collections (ids "
                          f"{', '.join(map(str, sorted(found)))}): set option collection to pick one")
    cid, (coll, src) = next(iter(found.items()))
    log.info("inferred the schema of collection %s from a %s message", cid, src)
    return coll, cid


def primary_key(coll_schema: Any) -> str | None:
    return next((f.name for f in coll_schema.fields if f.is_primary_key), None)


def infer_arrow(opts: ReadOptions, channels: list[str]) -> tuple[pa.Schema, str | None, int | None]:
    """(Arrow schema of the output, pk name, collection id) for ``opts``; SchemaError if nothing is found."""
    if opts.output == "messages":
        return messages_arrow_schema(), None, None
    if opts.output == "collections":
        return collections_arrow_schema(), None, None
    coll, cid = infer_collection(opts, channels)
    return rows_arrow_schema(collection_arrow_schema(coll)), primary_key(coll), cid


def user_pk(schema: Any) -> str | None:
    """With a user-given schema, the primary key is its first collection field."""
    for f in (schema if isinstance(schema, pa.Schema) else schema.fields):
        if f.name != OP and f.name not in METADATA:
            return f.name
    return None
