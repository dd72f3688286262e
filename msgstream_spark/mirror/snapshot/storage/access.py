"""Where Milvus keeps its files and metadata, from the same ``milvus.yaml`` keys Milvus reads.

- ``common.storageType``: ``local`` (a standalone's ``localStorage.path``) or ``minio`` / ``remote``
  (S3-compatible: ``minio.address``, ``minio.port``, ``minio.useSSL``, ``minio.bucketName``,
  ``minio.rootPath``, ``minio.accessKeyID``, ``minio.secretAccessKey``, ``minio.region``).
- ``etcd.endpoints`` (the first one; its JSON gateway on the client port) and ``etcd.rootPath``.

Files are read through pyarrow's file systems (``LocalFileSystem``, ``S3FileSystem``); the settings are
plain picklable data (Spark tasks open their own file system) and print with the secret masked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pyarrow import fs

from msgstream_spark.errors import ConfigError, MirrorError

GC_SETTING = "dataCoord.gc.dropTolerance"


@dataclass(frozen=True)
class StorageSettings:
    kind: str  # "local" or "s3"
    root: str  # local: the directory; s3: "<bucket>/<rootPath>"
    endpoint: str = ""
    scheme: str = "http"
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    region: str = ""

    def __repr__(self) -> str:
        secret = "***" if self.secret_key else ""
        return (f"StorageSettings(kind={self.kind!r}, root={self.root!r}, endpoint={self.endpoint!r}, "
                f"access_key={self.access_key!r}, secret_key={secret!r})")

    def filesystem(self):
        if self.kind == "local":
            return fs.LocalFileSystem()
        return fs.S3FileSystem(access_key=self.access_key or None, secret_key=self.secret_key or None,
                               endpoint_override=self.endpoint, scheme=self.scheme, region=self.region or "us-east-1")

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if self.root else rel

    def where(self) -> str:
        return self.root if self.kind == "local" else f"s3://{self.root} at {self.scheme}://{self.endpoint}"


def storage_settings(config: Any) -> StorageSettings:
    """From ``common.storageType`` (default local) and its keys."""
    kind = (config.get_str("common.storageType") or "local").strip().lower()
    if kind == "local":
        root = config.get_str("localStorage.path")
        if not root:
            raise ConfigError("the storage snapshot reads a local Milvus's files, but config key localStorage.path "
                              "is not set (copy it from the milvus.yaml the server runs with)")
        return StorageSettings("local", root)
    if kind in ("minio", "remote", "s3"):
        addr = config.get_str("minio.address")
        bucket = config.get_str("minio.bucketName")
        if not addr or not bucket:
            raise ConfigError(f"common.storageType={kind}: config keys minio.address and minio.bucketName must be "
                              "set for the storage snapshot")
        port = config.get_str("minio.port")
        endpoint = addr if ":" in addr or not port else f"{addr}:{port}"
        ssl = str(config.get("minio.useSSL", False)).strip().lower() in ("true", "1", "yes")
        root = "/".join(p.strip("/") for p in (bucket, config.get_str("minio.rootPath")) if p.strip("/"))
        return StorageSettings("s3", root, endpoint, "https" if ssl else "http", config.get_str("minio.accessKeyID"),
                               config.get_str("minio.secretAccessKey"), config.get_str("minio.region"))
    raise ConfigError(f"common.storageType={kind!r}: the storage snapshot reads local or S3-compatible storage "
                      "(local, minio, remote)")


def etcd_settings(config: Any) -> tuple[str, str]:
    """(the first of ``etcd.endpoints``, ``etcd.rootPath``)."""
    eps = config.get("etcd.endpoints")
    first = (eps[0] if isinstance(eps, list) and eps else str(eps or "")).split(",")[0].strip()
    if not first:
        raise ConfigError("the storage snapshot reads Milvus's metadata from etcd, but config key etcd.endpoints is "
                          "not set (copy it from the milvus.yaml the server runs with)")
    return first, config.get_str("etcd.rootPath") or "by-dev"


def read_bytes(settings: StorageSettings, rel: str, segment: int, filesystem=None) -> bytes:
    """One file's bytes; a file that is gone names its segment and Milvus's GC setting."""
    fs_ = filesystem or settings.filesystem()
    path = settings.path(rel)
    try:
        with fs_.open_input_file(path) as f:
            return f.read()
    except FileNotFoundError as exc:
        raise SegmentGoneError(segment, path, settings) from exc
    except OSError as exc:
        if "not found" in str(exc).lower() or "no such" in str(exc).lower():
            raise SegmentGoneError(segment, path, settings) from exc
        raise MirrorError(f"cannot read {path} ({settings.where()}) of segment {segment}: {exc}") from exc


class SegmentGoneError(MirrorError):
    """A file of a planned segment is gone (garbage collection after a compaction or a drop)."""

    def __init__(self, segment: int, path: str, settings: StorageSettings | None = None, text: str = "") -> None:
        self.segment = segment
        super().__init__(text or f"segment {segment}: file {path} is gone from {settings.where() if settings else '?'} "
                         f"(Milvus's garbage collection removes files of compacted or dropped segments after "
                         f"{GC_SETTING}; the snapshot's plan is out of date: plan again, or raise that setting while "
                         "snapshotting)")

    @classmethod
    def in_text(cls, text: str) -> SegmentGoneError | None:
        """The error a Spark task raised, found in the text of the job's failure."""
        m = _GONE.search(text)
        return cls(int(m.group(1)), m.group(2), text=m.group(0)) if m else None


_GONE = re.compile(r"segment (-?\d+): file (\S+) is gone from .*?snapshotting\)", re.S)
