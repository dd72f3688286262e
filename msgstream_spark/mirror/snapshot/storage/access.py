"""Where Milvus keeps its files and metadata, from the same ``milvus.yaml`` keys Milvus reads.

- ``common.storageType``: ``local`` (a standalone's ``localStorage.path``) or ``minio`` / ``remote``
  (``minio.bucketName``, ``minio.rootPath``, ``minio.cloudProvider``, ``minio.address``, ``minio.port``,
  ``minio.useSSL``, ``minio.accessKeyID``, ``minio.secretAccessKey``, ``minio.region``, ``minio.useIAM``,
  ``minio.useVirtualHost``). A cloud provider of ``azure`` is Azure Blob (Milvus's own reading: the access key id
  is the account's name, the secret its key, the address the endpoint's suffix, ``core.windows.net``); ``gcp``
  with ``useIAM`` is GCS with the machine's own credentials; every other (``aws``, ``minio``, ``gcp`` with HMAC
  keys, ...) is S3's API at ``address:port``.
- ``etcd.endpoints`` (the first one; its JSON gateway on the client port) and ``etcd.rootPath``.

Files are read through the mirror's own :class:`~msgstream_spark.mirror.store.Store` (the one storage client of the
mirror: local, S3, GCS, Azure). The settings are resolved once, on the driver (only ``useIAM`` lets the driver's
object_store variables in), and are plain picklable data: a Spark task builds its store from them with
:func:`~msgstream_spark.mirror.store.store_for`, never from its own environment. They print with secrets masked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.errors import ConfigError, MirrorError
from msgstream_spark.mirror.store import NotFound, Store, StoreError, mask, resolve_options, store_for, uri

GC_SETTING = "dataCoord.gc.dropTolerance"


@dataclass(frozen=True)
class StorageSettings:
    """Milvus's storage root as a location the store takes (a local directory, ``s3://bucket/rootPath``,
    ``az://container/rootPath``, ``gs://bucket/rootPath``) and its resolved object_store settings."""

    location: str
    options: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"StorageSettings(location={self.location!r}, options={mask(dict(self.options))!r})"

    @property
    def kind(self) -> str:
        """``local``, ``s3``, ``gcs`` or ``azure``."""
        return uri.parse(self.location).kind

    def store(self) -> Store:
        """The store of Milvus's files, from these settings only (what a Spark task builds: its own machine's
        object_store variables never take effect)."""
        return store_for(self.location, dict(self.options))

    def path(self, rel: str) -> str:
        """The full location of a file Milvus's metadata names relative to its root path."""
        return uri.join(self.location, rel)

    def where(self) -> str:
        end = self.options.get("aws_endpoint") or self.options.get("azure_storage_endpoint") or \
            self.options.get("google_base_url")
        return f"{self.location} at {end}" if end else self.location


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def storage_settings(config: Any, env: Mapping[str, str] | None = None) -> StorageSettings:
    """From ``common.storageType`` (default local) and its keys; ``env`` (default the process's) is read only
    with ``minio.useIAM`` (the machine's own credentials)."""
    kind = (config.get_str("common.storageType") or "local").strip().lower()
    if kind == "local":
        root = config.get_str("localStorage.path")
        if not root:
            raise ConfigError("the storage snapshot reads a local Milvus's files, but config key localStorage.path "
                              "is not set (copy it from the milvus.yaml the server runs with)")
        return StorageSettings(uri.parse(root).key)
    if kind not in ("minio", "remote", "s3"):
        raise ConfigError(f"common.storageType={kind!r}: the storage snapshot reads local or object storage "
                          "(local, minio, remote)")
    bucket = config.get_str("minio.bucketName")
    if not bucket:
        raise ConfigError(f"common.storageType={kind}: config key minio.bucketName must be set for the storage "
                          "snapshot")
    root = "/".join(p.strip("/") for p in (bucket, config.get_str("minio.rootPath")) if p.strip("/"))
    provider = (config.get_str("minio.cloudProvider") or "aws").strip().lower()
    iam = _true(config.get("minio.useIAM", False))
    given = env if iam else {}
    key_id, secret = config.get_str("minio.accessKeyID"), config.get_str("minio.secretAccessKey")
    addr = config.get_str("minio.address")
    if provider == "azure":
        opts = {"azure_storage_account_name": key_id, "azure_storage_account_key": None if iam else secret}
        if addr and addr.strip(".") != "core.windows.net":
            opts["azure_storage_endpoint"] = f"https://{key_id}.blob.{addr.strip('.')}"
        return StorageSettings(f"az://{root}", resolve_options("azure", _set(opts), given))
    if provider == "gcp" and iam:
        return StorageSettings(f"gs://{root}", resolve_options("gcs", {}, given))
    if not addr:
        raise ConfigError(f"common.storageType={kind}: config key minio.address must be set for the storage "
                          "snapshot (with minio.bucketName)")
    port = config.get_str("minio.port")
    ssl = _true(config.get("minio.useSSL", False))
    host = addr if ":" in addr or not port else f"{addr}:{port}"
    opts = {"aws_endpoint": f"{'https' if ssl else 'http'}://{host}", "aws_access_key_id": key_id,
            "aws_secret_access_key": secret, "aws_region": config.get_str("minio.region") or "us-east-1",
            "aws_allow_http": None if ssl else "true",
            "aws_virtual_hosted_style_request": "true" if _true(config.get("minio.useVirtualHost", False)) else None}
    return StorageSettings(f"s3://{root}", resolve_options("s3", _set(opts), given))


def _set(options: dict[str, Any]) -> dict[str, Any]:
    """The options that have a value (an empty key id: none given)."""
    return {k: v for k, v in options.items() if v not in (None, "")}


def etcd_settings(config: Any) -> tuple[str, str]:
    """(the first of ``etcd.endpoints``, ``etcd.rootPath``)."""
    eps = config.get("etcd.endpoints")
    first = (eps[0] if isinstance(eps, list) and eps else str(eps or "")).split(",")[0].strip()
    if not first:
        raise ConfigError("the storage snapshot reads Milvus's metadata from etcd, but config key etcd.endpoints is "
                          "not set (copy it from the milvus.yaml the server runs with)")
    return first, config.get_str("etcd.rootPath") or "by-dev"


def read_bytes(settings: StorageSettings, rel: str, segment: int, store: Store | None = None) -> bytes:
    """One file's bytes through the store (``store``: one already made from ``settings``); a file that is gone
    names its segment and Milvus's GC setting."""
    path = settings.path(rel)
    try:
        return (store if store is not None else settings.store()).read(path)
    except NotFound as exc:
        raise SegmentGoneError(segment, path, settings) from exc
    except (StoreError, OSError) as exc:  # a local store's other errors (permissions) are the OS's
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
