"""The source's Spark schema: fixed for ``messages``, inferred or given for ``rows``.

Inference reads the channels from the start position until it finds, for the wanted
collection, a CreateCollection message (the authoritative schema) or a first insert.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg import codec
from msgstream_spark.msg.schema import collection_arrow_schema, infer_collection_schema
from msgstream_spark.msg.types import MsgType
from msgstream_spark.spark.options import ReadOptions
from msgstream_spark.spark.rows import METADATA, OP, messages_struct, rows_struct

log = logging.getLogger(__name__)

INFER_MAX_MESSAGES = 100_000
INFER_SECONDS = 30.0


def collection_fields(coll_schema: Any) -> tuple[list, str | None]:
    """(StructFields of the collection's user fields, primary key name)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField


    arrow = collection_arrow_schema(coll_schema)
    pk = next((f.name for f in coll_schema.fields if f.is_primary_key), None)
    return [StructField(f.name, from_arrow_type(f.type), True) for f in arrow], pk


def _matches(opts: ReadOptions, cid: int, name: str) -> bool:
    want = opts.collection
    return want is None or want == str(cid) or want == name


def _scan_schemas(opts: ReadOptions, channels: list[str]) -> tuple[dict[int, tuple[Any, str]], dict[int, int]]:
    """({collection id: (CollectionSchema, source)}, {collection id: creation time}) found in the
    channels' CreateCollection messages (else their first insert), within the inference budget."""
    found: dict[int, tuple[Any, str]] = {}
    created: dict[int, int] = {}  # time of its CreateCollection (else first insert)
    client = opts.client()
    deadline = time.monotonic() + INFER_SECONDS
    try:
        for ch in channels:
            cons = client.reader(ch)
            try:
                cons.seek(client.earliest_message_id(), inclusive=True)
                seen = 0
                while seen < INFER_MAX_MESSAGES and time.monotonic() < deadline:
                    batch = cons.receive_batch(1024, 0.2)
                    if not batch:
                        break
                    seen += len(batch)
                    for m in batch:
                        _note_schema(opts, ch, m, found, created)
                    if found and opts.collection is not None:
                        break
            finally:
                cons.unsubscribe()  # a throwaway inference subscription
    finally:
        client.close()
    return found, created


def _note_schema(opts: ReadOptions, ch: str, m: Any, found: dict, created: dict) -> None:
    """Record the schema one raw message tells (a CreateCollection wins over an insert)."""
    try:
        t = codec.peek_msg_type(m.payload, m.properties)
    except Exception:  # noqa: BLE001 - corrupt messages do not stop inference
        return
    if t not in (MsgType.CreateCollection, MsgType.Insert):
        return
    try:
        msg = codec.unmarshal(m.payload, m.properties, channel=ch)
    except Exception:  # noqa: BLE001
        return
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


def infer(opts: ReadOptions, channels: list[str]) -> tuple[Any, str | None, int | None]:
    """(StructType, pk name, collection id) for ``opts``; SchemaError if nothing is found."""
    if opts.output == "messages":
        return messages_struct(), None, None
    found, created = _scan_schemas(opts, channels)
    if not found:
        what = f"collection {opts.collection!r}" if opts.collection else "any collection"
        raise SchemaError(
            f"cannot infer a schema: no CreateCollection or Insert message of {what} found in channel(s) "
            f"{', '.join(channels)}; give one with .schema(...) or option schema, or use output=messages")
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
    fields, pk = collection_fields(coll)
    log.info("inferred the schema of collection %s from a %s message", cid, src)
    return rows_struct(fields), pk, cid


def user_pk(schema: Any) -> str | None:
    """With a user-given schema, the primary key is its first collection field."""
    for f in schema.fields:
        if f.name != OP and f.name not in METADATA:
            return f.name
    return None
