"""Object stores (S3 and S3-compatible servers, GCS, Azure Blob / ADLS) through obstore, the Python binding of
Rust's ``object_store`` that delta-rs and Polars use: one config vocabulary with them, and the conditional puts
the commit needs (``mode="create"``: S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure
``If-None-Match: *``; ``mode={"e_tag": ...}``: ``If-Match``). Parquet streams use obstore's multipart writer and
ranged reader (docs/mirror.md, "Where the table lives", has the measurements behind the choice).

The client is made lazily in each process from the plain settings, so the store pickles into Spark tasks. obstore's
constructors also read the process's own object_store variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) under the
settings given; for a store whose settings were resolved in another process (a task's: unpickled, or built by
``store_for``) every such variable is overridden by an explicit setting, or refused (:mod:`.shipped`), so an
executor's environment never changes where or as whom a task writes; the environment itself is never changed.

A refused conditional put (412, already exists) is read back: if the object holds exactly the bytes sent, an
earlier attempt of this put landed and its answer was lost (obstore retries after a 5xx or a dropped
connection, and its retry is refused because of the first), and the put succeeded. S3's 409
``ConditionalRequestConflict`` (another conditional write of the key in flight) is retried.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import settings, shipped, uri
from msgstream_spark.mirror.store.base import COUNTS, ObjectMeta, Store
from msgstream_spark.mirror.store.errors import AlreadyExists, Conflict, NotFound, StoreError

CONFLICT_RETRIES = 8  # S3 answers 409 ConditionalRequestConflict to a conditional put racing another: retried
PART_SIZE = 16 * 1024 * 1024  # multipart part size of open_output (S3's parts: 5 MiB to 5 GiB)
log = logging.getLogger(__name__)


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as e:
        raise MirrorError("a table in object storage needs obstore: pip install 'msgstream-spark[mirror]'") from e
    return obstore


# shipped stores' clients, per process: a Spark task builds a store per table it writes or plans (``store_for``,
# an unpickled ``PlanTarget``), each made its own client and connections (~4 ms of CPU and a new connection a
# table on the S3 server); one client per bucket and settings serves them all (obstore's clients are thread-safe)
_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_MAX = 64
_CLIENTS_LOCK = threading.Lock()


def _shared(key: tuple, make) -> Any:
    """The client of ``key`` in this process (the process id in the key: a forked child makes its own, never using
    its parent's runtime), made by ``make()`` the first time."""
    key = (os.getpid(), *key)
    with _CLIENTS_LOCK:
        got = _CLIENTS.get(key)
        if got is None:
            got = _CLIENTS[key] = make()
            while len(_CLIENTS) > _CLIENTS_MAX:
                _CLIENTS.pop(next(iter(_CLIENTS)))
        return got


def _racing(e: BaseException) -> bool:
    """Whether an error is S3's 409 ``ConditionalRequestConflict``: another conditional write of the key is in
    flight; retry (object_store retries it itself for ``If-Match`` only, and reports it as already-exists)."""
    return "ConditionalRequestConflict" in str(e)


class ObjectStore(Store):
    def __init__(self, root: str, options: dict[str, str] | None = None, shipped: bool = False) -> None:
        """``shipped``: ``options`` were resolved in another process (the driver); this process's own
        object_store variables never take effect (:mod:`.shipped`)."""
        super().__init__(root, options)
        loc = uri.parse(root)
        self.kind = loc.kind
        self.bucket_root = loc.root
        self.shipped = shipped
        self._client: Any = None

    def __getstate__(self) -> dict:
        return {"root": self.root, "options": self.options, "kind": self.kind, "bucket_root": self.bucket_root}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.shipped = True  # unpickled: its settings were resolved where it was made
        self._client = None

    def client(self) -> Any:
        """This process's obstore client for the bucket (made on first use; a shipped store's is shared by every
        shipped store of this process with the same bucket and settings: :func:`_shared`)."""
        if self._client is None:
            _obstore()
            config, client = settings.for_obstore(self.options)
            creds = None
            if self.shipped:  # undo what obstore would take from this process's environment (shipped.py)
                pins, creds = shipped.pins(self.kind, self.options, self.bucket_root, os.environ)
                config.update(pins)
                self._client = _shared((self.bucket_root, repr(sorted(config.items())), repr(sorted(client.items())),
                                        repr(sorted((creds or {}).items()))),
                                       lambda: self._make(config, client, creds))
            else:
                self._client = self._make(config, client, creds)
        return self._client

    def _make(self, config: dict, client: dict, creds: dict | None) -> Any:
        from obstore.store import from_url

        more: dict[str, Any] = {}
        if creds is not None:
            more["credential_provider"] = lambda: {**creds, "expires_at": None}
        try:  # client options always given: they replace the environment's (AWS_ALLOW_HTTP, AWS_PROXY_URL...)
            if "aws_endpoint_url_s3" in config:  # obstore 0.12's from_url loses this key (drops its aws_)
                from obstore.store import S3Store

                name = () if "aws_bucket" in config else (self.bucket_root.split("://", 1)[1],)
                return S3Store(*name, config=config, client_options=client, **more)
            return from_url(self.bucket_root, config=config, client_options=client, **more)
        except Exception as e:  # noqa: BLE001 - obstore raises several kinds for a bad setting
            raise StoreError(self._error("opening the store for", self.bucket_root, e)) from e

    def _key(self, target: str) -> str:
        loc = uri.parse(target)
        if loc.root != self.bucket_root:
            raise StoreError(f"{target} is not in the store of {self.root} (bucket {self.bucket_root})")
        return loc.key

    def _meta(self, target: str, m: dict) -> ObjectMeta:
        mtime = m.get("last_modified")
        return ObjectMeta(target, int(m.get("size", 0)), m.get("e_tag"), mtime.timestamp() if mtime else time.time())

    def _fail(self, what: str, target: str, e: BaseException) -> StoreError:
        if isinstance(e, FileNotFoundError):
            return NotFound(settings.mask(f"{target}: no such object", self.options))
        return StoreError(self._error(what, target, e))

    def read(self, target: str) -> bytes:
        ob = _obstore()
        try:
            data = ob.get(self.client(), self._key(target)).bytes().to_bytes()
            COUNTS.add(read=len(data))
            return data
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._fail("reading", target, e) from e

    def get(self, target: str) -> tuple[bytes, ObjectMeta]:
        ob = _obstore()
        try:
            r = ob.get(self.client(), self._key(target))
            data = r.bytes().to_bytes()
            COUNTS.add(read=len(data))
            return data, self._meta(target, r.meta)
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._fail("reading", target, e) from e

    def read_range(self, target: str, offset: int, length: int) -> bytes:
        ob = _obstore()
        try:
            data = ob.get_range(self.client(), self._key(target), start=offset, length=length).to_bytes()
            COUNTS.add(read=len(data))
            return data
        except Exception as e:  # noqa: BLE001
            raise self._fail("reading a range of", target, e) from e

    def head(self, target: str) -> ObjectMeta | None:
        ob = _obstore()
        COUNTS.add()
        try:
            return self._meta(target, ob.head(self.client(), self._key(target)))
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            raise self._fail("reading the metadata of", target, e) from e

    def _put(self, target: str, data: bytes, mode: Any, what: str) -> ObjectMeta:
        ob = _obstore()
        exc = ob.exceptions
        for attempt in range(CONFLICT_RETRIES):
            COUNTS.add(written=len(data))
            try:
                r = ob.put(self.client(), self._key(target), data, mode=mode)
                return ObjectMeta(target, len(data), r.get("e_tag"), time.time())
            except Exception as e:  # noqa: BLE001 - obstore raises several kinds
                if _racing(e):  # a conditional put of this key in flight (maybe our own lost one): retry
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                refused = isinstance(e, (exc.AlreadyExistsError, exc.PreconditionError, FileNotFoundError))
                if mode == "overwrite" or not refused:
                    raise StoreError(self._error(what, target, e)) from e
                landed = self._landed(target, data, e)
                if landed is not None:
                    return landed
                raise self._refused(target, mode, what, e) from e
        raise StoreError(f"{what} {target}: {CONFLICT_RETRIES} conditional-put conflicts (409) in a row")

    def _landed(self, target: str, data: bytes, refusal: BaseException) -> ObjectMeta | None:
        """After a refused conditional put: the object's metadata if it holds exactly ``data`` (the put landed,
        and its answer was lost: obstore retried it after a 5xx or a dropped connection, and the retry was
        refused because of it), None if it holds anything else or nothing. Identical bytes are taken for this
        writer's own: what the puts write is unique to one writer and one attempt (a lease record names its
        holder's token and time, a Delta commit its data files' random names and its timestamp)."""
        try:
            got, meta = self.get(target)
        except NotFound:
            return None
        except StoreError as e:
            raise StoreError(settings.mask(f"{target}: the store refused a conditional put ({refusal}), and "
                                           f"reading the object back to learn whether an earlier attempt of this "
                                           f"put landed failed: {e}", self.options)) from e
        if got != data:
            return None
        log.info("%s: a conditional put was refused but the object holds exactly its bytes: an earlier attempt "
                 "landed and its answer was lost; taken as written", target)
        return meta

    def _refused(self, target: str, mode: Any, what: str, e: BaseException) -> StoreError:
        if isinstance(mode, dict):
            if isinstance(e, FileNotFoundError):
                return Conflict(f"{target} is gone: it was deleted since etag {mode['e_tag']} was read")
            return Conflict(f"{target} changed or is gone since etag {mode['e_tag']} was read")
        if isinstance(e, FileNotFoundError):
            return StoreError(self._error(what, target, e))
        return AlreadyExists(settings.mask(f"{target} already exists: another writer created it first",
                                           self.options))

    def put(self, target: str, data: bytes) -> ObjectMeta:
        return self._put(target, data, "overwrite", "writing")

    def put_if_absent(self, target: str, data: bytes) -> ObjectMeta:
        return self._put(target, data, "create", "creating")

    def put_if_match(self, target: str, data: bytes, etag: str) -> ObjectMeta:
        return self._put(target, data, {"e_tag": etag}, "replacing")

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        ob = _obstore()
        key = self._key(prefix)
        try:
            for chunk in ob.list(self.client(), prefix=key or None):
                COUNTS.add()
                for m in chunk:
                    yield self._meta(uri.Location(self.kind, "", self.bucket_root, m["path"]).uri(), m)
        except Exception as e:  # noqa: BLE001
            raise self._fail("listing", prefix, e) from e

    def delete(self, target: str) -> None:
        ob = _obstore()
        COUNTS.add()
        try:
            ob.delete(self.client(), self._key(target))
        except FileNotFoundError:
            return
        except Exception as e:  # noqa: BLE001
            raise self._fail("deleting", target, e) from e

    def open_output(self, target: str) -> _Output:
        return _Output(_obstore().open_writer(self.client(), self._key(target), buffer_size=PART_SIZE), target)

    def open_input(self, target: str) -> _Input:
        meta = self.head(target)
        if meta is None:
            raise NotFound(settings.mask(f"{target}: no such object", self.options))
        return _Input(self, target, meta.size)


class _Output:
    """obstore's buffered (multipart) writer as the file object pyarrow writes to: the object is completed by
    ``close``; an exception in the ``with`` block (or dropping it unclosed) completes nothing."""

    def __init__(self, writer: Any, target: str) -> None:
        self._w = writer
        self._pos = 0
        self._done = False
        self.name = target

    def write(self, data: Any) -> int:
        n = self._w.write(data)
        size = len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
        self._pos += size
        COUNTS.add(written=size, requests=0)
        return n

    def tell(self) -> int:
        return self._pos

    @property
    def closed(self) -> bool:
        return self._done

    def flush(self) -> None:  # parts go up as the buffer fills; the rest with close
        return None

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._w.close()
            COUNTS.add(requests=max(1, -(-self._pos // PART_SIZE)))

    def abort(self) -> None:
        self._done = True
        self._w = None  # dropped without close: the upload is never completed

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class _Input:
    """A seekable stream over an object, each read one ranged GET of exactly what was asked (pyarrow's Parquet
    reader asks for the footer, then for whole column chunks): what it fetches is what it counts."""

    def __init__(self, store: ObjectStore, target: str, size: int) -> None:
        self._store, self._target, self._size = store, target, size
        self._pos = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        n = self._size - self._pos if size is None or size < 0 else min(size, self._size - self._pos)
        if n <= 0:
            return b""
        data = self._store.read_range(self._target, self._pos, n)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1 else self._size + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> _Input:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
