"""The local file system as a store: a plain path or a ``file://`` URI. A put is a temporary file, fsync'd and
moved into place, then the directory fsync'd (an empty object not there yet, a writing task's claim, is created in
place and its directory fsync'd: empty, it is whole once it exists); ``put_transient`` and ``open_transient`` (a
cache its readers check, a batch's state a crash re-runs) move the file into place without an fsync; put-if-absent
publishes it by hard link (which fails if the name exists: the atomic create-if-absent of a POSIX file system);
put-if-match holds an exclusive ``flock`` on the current file while it compares and replaces it. An etag is the
file's inode, modification time and size, which every put changes (each put makes a new inode)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import uuid
from collections.abc import Iterator

from msgstream_spark.mirror.store import uri
from msgstream_spark.mirror.store.base import COUNTS, ObjectMeta, Store
from msgstream_spark.mirror.store.errors import AlreadyExists, Conflict, NotFound, StoreError


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a new entry in it survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _in_dir(path: str, create):
    """``create()`` of a file at ``path``, its directory made if missing (only then: a makedirs at every file costs
    a failed mkdir and its exception)."""
    try:
        return create()
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return create()


def _created(path: str, mode: str):
    """``open(path, mode)`` for writing, its directory made if missing."""
    return _in_dir(path, lambda: open(path, mode))


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStore(Store):
    kind = "local"

    def _path(self, target: str) -> str:
        return uri.parse(target).key

    def _meta(self, target: str, st: os.stat_result) -> ObjectMeta:
        return ObjectMeta(target, st.st_size, _etag(st), st.st_mtime)

    def read(self, target: str) -> bytes:
        try:
            with open(self._path(target), "rb") as f:
                data = f.read()
            COUNTS.add(read=len(data))
            return data
        except FileNotFoundError as e:
            raise NotFound(f"{target}: no such object") from e

    def get(self, target: str) -> tuple[bytes, ObjectMeta]:
        try:
            with open(self._path(target), "rb") as f:
                data = f.read()
                COUNTS.add(read=len(data))
                return data, self._meta(target, os.fstat(f.fileno()))
        except FileNotFoundError as e:
            raise NotFound(f"{target}: no such object") from e

    def read_range(self, target: str, offset: int, length: int) -> bytes:
        try:
            with open(self._path(target), "rb") as f:
                data = os.pread(f.fileno(), length, offset)
            COUNTS.add(read=len(data))
            return data
        except FileNotFoundError as e:
            raise NotFound(f"{target}: no such object") from e

    def head(self, target: str) -> ObjectMeta | None:
        COUNTS.add()
        try:
            st = os.stat(self._path(target))
        except FileNotFoundError:
            return None
        return self._meta(target, st)

    def _temp(self, path: str, data: bytes, sync: bool = True) -> str:
        COUNTS.add(written=len(data))
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        with _created(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def put(self, target: str, data: bytes) -> ObjectMeta:
        path = self._path(target)
        if not data and self._create_empty(path):
            return self._meta(target, os.stat(path))
        os.replace(self._temp(path, data), path)
        fsync_path(os.path.dirname(path))
        return self._meta(target, os.stat(path))

    def put_transient(self, target: str, data: bytes) -> ObjectMeta:
        path = self._path(target)
        os.replace(self._temp(path, data, sync=False), path)
        return self._meta(target, os.stat(path))

    def _create_empty(self, path: str) -> bool:
        """An empty object that is not there yet: created in place (empty, it is whole as soon as it exists; no
        temporary file, nothing to fsync but its directory). False if the name exists (``put`` replaces it)."""
        try:
            with _created(path, "xb"):
                pass
        except FileExistsError:
            return False
        COUNTS.add()
        fsync_path(os.path.dirname(path))
        return True

    def put_if_absent(self, target: str, data: bytes) -> ObjectMeta:
        path = self._path(target)
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError as e:
            raise AlreadyExists(f"{target} already exists: another writer created it first") from e
        except OSError as e:  # a mount without hard links has no atomic create-if-absent
            raise StoreError(f"cannot create {target} if absent: the file system refused a hard link ({e}); "
                             "a local table needs a file system with hard links") from e
        finally:
            os.unlink(tmp)
        fsync_path(os.path.dirname(path))
        return self._meta(target, os.stat(path))

    def put_if_match(self, target: str, data: bytes, etag: str) -> ObjectMeta:
        path = self._path(target)
        for _ in range(1000):  # each retry follows another writer's replace: bounded by the writers' puts
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError as e:
                raise Conflict(f"{target} is gone: it was deleted since etag {etag} was read") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    st = os.stat(path)
                except FileNotFoundError as e:
                    raise Conflict(f"{target} is gone: it was deleted since etag {etag} was read") from e
                if st.st_ino != os.fstat(fd).st_ino:
                    continue  # replaced while we waited for the lock: lock the current file
                if _etag(st) != etag:
                    raise Conflict(f"{target} changed since etag {etag} was read (now {_etag(st)})")
                os.replace(self._temp(path, data), path)
                fsync_path(os.path.dirname(path))
                return self._meta(target, os.stat(path))
            finally:
                os.close(fd)
        raise Conflict(f"{target}: put-if-match lost to other writers 1000 times")

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        base = self._path(prefix)
        COUNTS.add()
        head = uri.join(prefix, "x")[:-1]  # ``prefix`` in its style (a path or a file:// URI) and a separator
        for dirpath, _dirs, files in os.walk(base):
            under = os.path.relpath(dirpath, base)  # once a directory, not once a file
            for name in files:
                path = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):  # removed while we listed
                    yield self._meta(head + (name if under == "." else os.path.join(under, name)), os.stat(path))

    def delete(self, target: str) -> None:
        COUNTS.add()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(target))

    def open_output(self, target: str) -> _AtomicFile:
        return _AtomicFile(self._path(target))

    def open_transient(self, target: str) -> _AtomicFile:
        return _AtomicFile(self._path(target), sync=False)

    def open_input(self, target: str) -> _Input:
        try:
            return _Input(self._path(target))
        except FileNotFoundError as e:
            raise NotFound(f"{target}: no such object") from e


class _Input(io.FileIO):
    """A local file read by range (what pyarrow's Parquet reader takes), its bytes counted."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "rb")
        COUNTS.add()

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        COUNTS.add(read=len(data), requests=0)
        return data

    def readinto(self, buffer) -> int:
        n = super().readinto(buffer)
        COUNTS.add(read=n or 0, requests=0)
        return n

    def size(self) -> int:
        return os.fstat(self.fileno()).st_size


class _AtomicFile(io.FileIO):
    """A file written under a temporary name and moved to its own when closed (after fsync), so no reader sees
    a part of it; leaving a ``with`` block by an exception removes it instead."""

    def __init__(self, path: str, sync: bool = True) -> None:
        self.final, self.sync = path, sync
        self.tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        _in_dir(self.tmp, lambda: io.FileIO.__init__(self, self.tmp, "wb"))
        COUNTS.add()

    def write(self, data) -> int:
        n = super().write(data)
        COUNTS.add(written=n or 0, requests=0)
        return n

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        if self.sync:
            os.fsync(self.fileno())
        super().close()
        os.replace(self.tmp, self.final)
        if self.sync:
            fsync_path(os.path.dirname(self.final))

    def abort(self) -> None:
        if not self.closed:
            super().close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:  # dropped unclosed (a task that died mid-write): nothing is published
        self.abort()
