"""The store's errors: every one is a :class:`~msgstream_spark.errors.MirrorError` and names the object's URI;
none carries a secret (messages pass through :func:`msgstream_spark.mirror.store.settings.mask`)."""

from __future__ import annotations

from msgstream_spark.errors import MirrorError


class StoreError(MirrorError):
    """A read, write, listing or delete on the table's store failed (the cause is chained)."""


class NotFound(StoreError, FileNotFoundError):
    """The object does not exist (also a ``FileNotFoundError``, as a local ``open`` would raise)."""


class AlreadyExists(StoreError):
    """A put-if-absent found the object there: another writer created it first (S3: 412 on ``If-None-Match: *``)."""


class Conflict(StoreError):
    """A put-if-match found the object changed or gone: another writer replaced it since its etag was read."""
