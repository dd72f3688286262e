"""The one interface every read, write, listing and conditional put of the mirror goes through.

A :class:`Store` is opened on a location (a URI or a local path) and takes full URIs under it; it holds plain
configuration only (the kind, the root, the resolved settings), so it pickles into Spark tasks, and opens its
client lazily in each process. Conditional puts are what the commit protocols and the writer lease stand on:
``put_if_absent`` creates an object only if there is none (:class:`AlreadyExists` otherwise),
``put_if_match`` replaces it only if its etag is unchanged (:class:`Conflict` otherwise).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from msgstream_spark.mirror.store import settings, uri


@dataclass(frozen=True)
class ObjectMeta:
    """One object: its full URI, size in bytes, etag (a version token that changes on every write; the
    precondition of :meth:`Store.put_if_match`) and last-modified time (seconds since the epoch)."""

    uri: str
    size: int
    etag: str | None
    mtime: float


class IOCount:
    """What this process moved through its stores (every store, every thread): bytes read, bytes written,
    requests. A step's cost is the difference of two :meth:`totals` (a Spark task's is shipped to the driver)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.read = self.written = self.requests = 0

    def add(self, read: int = 0, written: int = 0, requests: int = 1) -> None:
        with self._lock:
            self.read += read
            self.written += written
            self.requests += requests

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {"read": self.read, "written": self.written, "requests": self.requests}


COUNTS = IOCount()


def io_totals() -> dict[str, int]:
    """What this process moved through its stores so far (``COUNTS.totals()``; a function, so that a Spark
    task's closure pickles a reference to it, not the counter)."""
    return COUNTS.totals()


def io_since(before: dict[str, int]) -> dict[str, int]:
    """What this process moved through its stores since ``before`` (an earlier ``COUNTS.totals()``)."""
    now = COUNTS.totals()
    return {k: now[k] - before.get(k, 0) for k in now}


class Store(ABC):
    """A table's store. ``root`` is the location it was opened on; every method takes full URIs (see
    :meth:`join`); ``options`` are the resolved settings (canonical object_store keys, secrets included: print
    :meth:`masked_options`, never ``options``)."""

    kind: str = ""

    def __init__(self, root: str, options: dict[str, str] | None = None) -> None:
        self.root = root
        self.options = dict(options or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r}, options={self.masked_options()!r})"

    def masked_options(self) -> dict[str, str]:
        return settings.mask(self.options)

    def join(self, *parts: str) -> str:
        """The full URI of ``parts`` under the root."""
        return uri.join(self.root, *parts)

    def storage_options(self) -> dict[str, str]:
        """The settings in the form deltalake and Polars take (object_store keys)."""
        return dict(self.options)

    def pyiceberg_properties(self) -> dict[str, str]:
        """The settings as pyiceberg FileIO properties (``s3.endpoint``, ``s3.access-key-id``, ...)."""
        return settings.for_pyiceberg(self.options)

    def _error(self, what: str, target: str, exc: BaseException) -> str:
        """An error text naming the operation and the object, the cause's text with every secret masked."""
        return settings.mask(f"{what} {target} failed: {type(exc).__name__}: {exc}", self.options)

    @abstractmethod
    def read(self, target: str) -> bytes:
        """The whole object (NotFound if there is none)."""

    @abstractmethod
    def get(self, target: str) -> tuple[bytes, ObjectMeta]:
        """The whole object and its metadata, read together (the etag is that of these bytes)."""

    @abstractmethod
    def read_range(self, target: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the object)."""

    @abstractmethod
    def head(self, target: str) -> ObjectMeta | None:
        """The object's metadata, or None if there is none."""

    @abstractmethod
    def put(self, target: str, data: bytes) -> ObjectMeta:
        """Write the object whole (readers see the old or the new bytes, never a part)."""

    @abstractmethod
    def put_if_absent(self, target: str, data: bytes) -> ObjectMeta:
        """Create the object if there is none; AlreadyExists if there is one (nothing written)."""

    @abstractmethod
    def put_if_match(self, target: str, data: bytes, etag: str) -> ObjectMeta:
        """Replace the object if its etag is still ``etag``; Conflict if it changed or is gone."""

    @abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """Every object under ``prefix`` (a directory-like URI), at any depth, in no set order."""

    @abstractmethod
    def delete(self, target: str) -> None:
        """Remove the object; removing one that is not there is no error."""

    @abstractmethod
    def open_output(self, target: str) -> IO[bytes]:
        """A binary stream to write the object through (what ``pyarrow.parquet.ParquetWriter`` takes); the
        object appears whole when the stream is closed, and not at all if the ``with`` block raised."""

    def put_transient(self, target: str, data: bytes) -> ObjectMeta:
        """:meth:`put` of an object whose loss in a crash is harmless (a cache its readers check and rebuild, a
        batch's state between its stages, which a crash re-runs): whole or not at all to readers, as ``put``, but
        with no wait for the disk (a local path: no fsync). Other stores: ``put``."""
        return self.put(target, data)

    def open_transient(self, target: str) -> IO[bytes]:
        """:meth:`open_output` of an object whose loss in a crash is harmless (see :meth:`put_transient`)."""
        return self.open_output(target)

    @abstractmethod
    def open_input(self, target: str) -> Any:
        """A seekable binary stream over the object, reading by range (for ``pyarrow.parquet.ParquetFile``)."""
