"""A small key/value file for what a read-only proxy cannot keep: metadata and subscription cursors.

The proxy stores nothing for readers, so the Spark source's resolved start positions and named
subscriptions' cursors live in one JSON file (``milvus.metadataPath``; by default under the user's
cache directory, one file per proxy address). Writes replace the file atomically under an
advisory lock, so several processes on one machine share it safely.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from msgstream_spark.errors import BackendError


class MetadataFile:
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(f"{self.path}.lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = self._read()
                before = dict(data)
                yield data
                if data != before:
                    tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(data, sort_keys=True))
                    os.replace(tmp, self.path)
        except OSError as exc:
            raise BackendError(f"cannot use the milvus backend's metadata file {self.path} "
                               f"(milvus.metadataPath): {exc.strerror}") from None

    def _read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise BackendError(f"the milvus backend's metadata file {self.path} is not valid JSON: {exc}") from None
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> str | None:
        with self._locked() as data:
            return data.get(key)

    def put(self, key: str, value: str) -> None:
        with self._locked() as data:
            data[key] = value

    def delete(self, key: str) -> None:
        with self._locked() as data:
            data.pop(key, None)
