"""The schema a database mirror job makes a collection's table with (``jobs.mirror_many.Tables``): its
CreateCollection's (or its newest 2.6 schema change's) when the stream carried one, else inferred from the channels.

Several collections whose tables a batch makes are inferred by one scan (:meth:`Schemas.prepare`,
``source.schema_many``): the job's first batch of a log that carries no CreateCollection (it was before the log's
retention, or the job starts at ``--from``) made 20 scans of the channels for 20 collections. A collection that
scan does not answer (Milvus describes it, it was not found) is inferred on its own as before.
"""

from __future__ import annotations

import logging
from typing import Any

from msgstream_spark.jobs._common import source_options

log = logging.getLogger("msgstream_spark.jobs.mirror")


class Schemas:
    """The job's schema inference (``args``: the job's arguments; ``named``: the source's channels option)."""

    def __init__(self, args, named: dict[str, str]) -> None:
        self.args, self.named = args, named
        self.ready: dict[int, Any] = {}  # collection id -> its CollectionSchema, found by the last prepare

    def _opts(self, collection: str | None):
        from msgstream_spark.source.options import parse_read_options

        return parse_read_options(source_options(self.args, collection=collection, **self.named), streaming=False)

    def _channels(self, opts) -> list[str]:
        from msgstream_spark.source.read import list_channels

        client = opts.client()
        try:
            return list_channels(opts, client)
        finally:
            client.close()

    def prepare(self, cids: list[int]) -> None:
        """The schemas of the collections ``cids`` (tables about to be made, no schema on the stream), read by
        one scan of the channels now; each is used once, by the next :meth:`__call__` for it."""
        from msgstream_spark.source.schema_many import infer_collections

        self.ready = {}
        if len(cids) < 2:
            return  # one collection: its own scan, as before
        opts = self._opts(None)
        self.ready = infer_collections(opts, self._channels(opts), sorted(cids))

    def __call__(self, cid: int, schema_bytes: bytes | None):
        """The collection's schema: its CreateCollection's, else the one :meth:`prepare` found, else inferred
        from the channels (by id)."""
        from msgstream_spark.msg.pb import schema_pb2

        if schema_bytes:
            self.ready.pop(cid, None)
            s = schema_pb2.CollectionSchema()
            s.ParseFromString(schema_bytes)
            return s
        got = self.ready.pop(cid, None)
        if got is not None:
            return got
        from msgstream_spark.source.schema import infer_collection

        opts = self._opts(str(cid))
        return infer_collection(opts, self._channels(opts))[0]
