"""The schemas of several collections from one scan of the channels (a database mirror job's new tables, issue #44).

:func:`~msgstream_spark.source.schema.infer_collection` reads the channels for one collection: asked for 20
collections that no CreateCollection on the stream described, it read them 20 times. :func:`infer_collections`
reads them once for all, noting each wanted collection as its own scan would: a CreateCollection wins over
inserts, a 2.6 AlterCollection's later schema over the creation's; a first scan of a long channel reads the same
windows backwards (:func:`~msgstream_spark.source.tailscan.look_back_each`), each collection's schema taken from
the newest window that tells it, going on while one of them is still untold. What it cannot answer as the
one-collection inference would, it leaves out (the caller asks ``infer_collection`` for those): one the scan
did not find, and every one when the scan ran out of time or the channels' ids are not offsets (Pulsar: its
ledger-bounded windows are not the same for several collections). Milvus is asked first as before (the
``milvus`` backend, ``milvus.address``: a DescribeCollection per collection); only those it does not describe
are scanned for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from msgstream_spark.errors import MsgStreamError
from msgstream_spark.source import schema
from msgstream_spark.source.options import ReadOptions

log = logging.getLogger(__name__)


class Wanted:
    """``opts`` reading the collections of ids ``wanted`` (``source.schema``'s notes keep only theirs)."""

    def __init__(self, opts: ReadOptions, wanted: frozenset[int]) -> None:
        self._opts = opts
        self.wanted = wanted
        # the scan state's key (source/scancache.py): one per set of ids, apart from any one-collection scan's
        self.collection = "ids:" + ",".join(map(str, sorted(wanted)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opts, name)


def infer_collections(opts: ReadOptions, channels: list[str], cids: list[int]) -> dict[int, Any]:
    """{collection id: CollectionSchema} for those of ``cids`` whose schema Milvus describes (each asked as
    :func:`~msgstream_spark.source.schema.infer_collection` asks) or one scan of ``channels`` tells as that
    function's own scan would (``opts``: the channels' read options, any ``collection`` ignored); the others are
    left out."""
    got: dict[int, Any] = {}
    client = opts.client()
    try:
        for cid in cids:  # the milvus backend's DescribeCollection, or the one at milvus.address (None: the log)
            described = schema._described(replace(opts, collection=str(cid)), client, [])
            if described is not None:
                got[cid] = described[0]
        rest = frozenset(c for c in cids if c not in got)
        if not rest or opts.schema_scan_messages > 0 and client.message_id_from_offset(0) is None:
            return got  # ids that are not offsets: windows bounded per collection (Pulsar's ledgers)
        t0 = time.monotonic()
        found, _ = schema._scan_schemas(Wanted(replace(opts, collection=None), rest), channels, client)
        if time.monotonic() - t0 >= schema.INFER_SECONDS:
            log.info("the schema scan of %d collections ran out of time: each is inferred on its own", len(rest))
            return got
    except MsgStreamError as exc:  # each collection's own inference says what is wrong, where
        log.warning("the schema scan of %d collections failed (%s): each is inferred on its own", len(cids), exc)
        return got
    finally:
        client.close()
    got.update({cid: found[cid][0] for cid in rest if cid in found})
    log.info("inferred the schemas of %d of %d collections by one scan of channel(s) %s", len(got), len(cids),
             ", ".join(channels))
    return got
