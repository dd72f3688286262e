"""Connection settings of the ``milvus`` backend (``milvus.*`` config keys).

The proxy address, credentials (a token, or user and password: sent base64-encoded in the
``authorization`` header as Milvus's SDKs do), the database, TLS, timeouts and gRPC keepalive.
Secrets are kept out of ``describe()``, ``repr`` and every error message.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

from msgstream_spark.config import Config
from msgstream_spark.errors import ConfigError
from msgstream_spark.msg.wal26 import WALName


def parse_collections(value: object, default_db: str, source: str = "milvus.collections") -> list[tuple[str, str]]:
    """``db.collection`` names (comma-separated or a list) or a JSON map ``{db: [collection, ...]}``."""
    if value in (None, ""):
        return []
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source} is not a valid JSON map of database -> collections: {exc}") from None
    if isinstance(value, dict):
        out = []
        for db, names in value.items():
            if isinstance(names, str):
                names = [n for n in names.split(",") if n.strip()]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ConfigError(f"{source}: database {db!r} must map to a list of collection names")
            out += [(str(db), n.strip()) for n in names]
        return out
    items = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[arg-type]
    out = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        db, _, name = item.rpartition(".")
        out.append((db or default_db or "default", name))
    return out


class MilvusSettings:
    def __init__(self, config: Config) -> None:
        self.address = config.get_str("milvus.address").strip()
        if not self.address:
            raise ConfigError(f"config key milvus.address is empty ({config.source})")
        self.address = re.sub(r"^(https?|tcp|grpc)://", "", self.address).rstrip("/")
        self.token = config.get_str("milvus.token")
        self.user = config.get_str("milvus.user")
        self.password = config.get_str("milvus.password")
        if self.token and (self.user or self.password):
            raise ConfigError(f"set either milvus.token or milvus.user/milvus.password, not both ({config.source})")
        if bool(self.user) != bool(self.password):
            raise ConfigError(f"config keys milvus.user and milvus.password must be set together ({config.source})")
        self.database = config.get_str("milvus.database")
        self.tls = config.get_bool("milvus.tls.enabled") or bool(config.get_str("milvus.tls.cacert"))
        self.ca_cert = config.get_str("milvus.tls.cacert")
        self.client_cert = config.get_str("milvus.tls.clientcert")
        self.client_key = config.get_str("milvus.tls.clientkey")
        self.server_name = config.get_str("milvus.tls.servername")
        if bool(self.client_cert) != bool(self.client_key):
            raise ConfigError(f"config keys milvus.tls.clientCert and milvus.tls.clientKey must be set together "
                              f"({config.source})")
        self.request_timeout = config.get_float("milvus.requesttimeout")
        self.idle_timeout = config.get_float("milvus.idletimeout")
        self.keepalive_time = config.get_float("milvus.keepalivetime")
        self.keepalive_timeout = config.get_float("milvus.keepalivetimeout")
        for key, v in (("requestTimeout", self.request_timeout), ("idleTimeout", self.idle_timeout),
                       ("keepaliveTime", self.keepalive_time), ("keepaliveTimeout", self.keepalive_timeout)):
            if v <= 0:
                raise ConfigError(f"config key milvus.{key} must be > 0 seconds, got {v:g} ({config.source})")
        try:
            self.wal = WALName.parse(config.get_str("milvus.wal").strip() or "unknown") \
                if config.get_str("milvus.wal").strip().lower() != "auto" else WALName.Unknown
        except ValueError as exc:
            raise ConfigError(f"config key milvus.wal: {exc} (or auto)") from None
        self.time_ticks = config.get_bool("milvus.timeticks")
        self.collections = parse_collections(config.get("milvus.collections"), self.database)
        path = config.get_str("milvus.metadatapath")
        if not path:
            cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            path = str(Path(cache) / "msgstream-spark" / f"milvus-{re.sub(r'[^A-Za-z0-9]+', '_', self.address)}.json")
        self.metadata_path = str(Path(path).expanduser())

    def authorization(self) -> str | None:
        """The ``authorization`` header value pymilvus sends (base64 of the token or ``user:password``)."""
        secret = self.token or (f"{self.user}:{self.password}" if self.user else "")
        return base64.b64encode(secret.encode()).decode() if secret else None

    def describe(self) -> str:
        """The address and non-secret settings, for errors and logs."""
        auth = "token=******" if self.token else (f"user={self.user} password=******" if self.user else "no auth")
        return (f"milvus.address={self.address} database={self.database or 'default'} {auth}"
                f"{' tls' if self.tls else ''}")

    def __repr__(self) -> str:
        return f"MilvusSettings({self.describe()})"

