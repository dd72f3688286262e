"""YAML configuration with Milvus's key names, environment overrides and secret masking.

Keys are case-insensitive like Milvus's paramtable: ``kafka.brokerList`` and
``kafka.brokerlist`` are the same key. A :class:`Config` is a flat mapping of
lower-cased dotted keys to values; it is plain data, so Spark can pickle it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from msgstream_spark.config.secrets import mask_mapping
from msgstream_spark.errors import ConfigError

log = logging.getLogger(__name__)

# Defaults of every key we read (Milvus's defaults where Milvus has the key).
# A user's milvus.yaml is layered on top of these; ``local.path`` is empty here so a
# cluster milvus.yaml selects Pulsar/Kafka, while the packaged default config sets it.
DEFAULTS: dict[str, Any] = {
    "mq.type": "default",
    "msgstream.mode": "standalone",
    "local.path": "",
    "local.retentiontimeinminutes": 4320,
    "local.retentionsizeinmb": 8192,
    "local.busytimeout": 30.0,
    "local.synchronous": "normal",
    "local.mmapsizemb": 1024,
    "pulsar.address": "",
    "pulsar.port": 6650,
    "pulsar.webport": 80,
    "pulsar.tenant": "public",
    "pulsar.namespace": "default",
    "pulsar.maxmessagesize": 2097152,
    "pulsar.requesttimeout": 60,
    "pulsar.authplugin": "",
    "pulsar.authparams": "",
    "pulsar.tlsallowinsecureconnection": False,
    "pulsar.tlstrustcertspath": "",
    "pulsar.tlsvalidatehostname": False,
    "kafka.brokerlist": "",
    "kafka.saslusername": "",
    "kafka.saslpassword": "",
    "kafka.saslmechanisms": "",
    "kafka.securityprotocol": "",
    "kafka.ssl.enabled": False,
    "kafka.ssl.tlscert": "",
    "kafka.ssl.tlskey": "",
    "kafka.ssl.tlscacert": "",
    "kafka.ssl.tlskeypassword": "",
    "kafka.readtimeout": 10,
    "kafka.requesttimeout": 30,
    "kafka.createtopics": True,
    "kafka.topicpartitions": 1,
    "kafka.topicreplicationfactor": 1,
    "msgchannel.channameprefix.cluster": "by-dev",
    "msgchannel.channameprefix.rootcoorddml": "rootcoord-dml",
    "rootcoord.dmlchannelnum": 16,
    # the read-only milvus backend (a Milvus 2.6 proxy's DumpMessages)
    "milvus.address": "localhost:19530",
    "milvus.token": "",
    "milvus.user": "",
    "milvus.password": "",
    "milvus.database": "",
    "milvus.collections": "",
    "milvus.wal": "auto",
    "milvus.timeticks": True,
    "milvus.tls.enabled": False,
    "milvus.tls.cacert": "",
    "milvus.tls.clientcert": "",
    "milvus.tls.clientkey": "",
    "milvus.tls.servername": "",
    "milvus.requesttimeout": 30,
    "milvus.idletimeout": 60,
    "milvus.keepalivetime": 30,
    "milvus.keepalivetimeout": 10,
    "milvus.metadatapath": "",
}

# Sections that belong to this project: an unknown key there is an error.
OWN_SECTIONS = ("local", "msgstream", "milvus")
# Pass-through maps: any key below these prefixes is accepted verbatim.
PASSTHROUGH_PREFIXES = ("kafka.producer.", "kafka.consumer.", "pulsar.client.")

VALID_MQ_TYPES = ("default", "local", "rocksmq", "kafka", "pulsar", "milvus")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{str(k).lower()}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


ENV_PREFIX = "MSGSTREAM_"


def _env_norm(name: str) -> str:
    """Milvus's paramtable matching: lower-case, without ``.``, ``_`` and ``/``."""
    return re.sub(r"[._/]", "", name.lower())


def env_overrides(values: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """The keys of ``values`` that environment variables set, by one rule.

    ``MSGSTREAM_<KEY>`` sets any key (``MSGSTREAM_MILVUS_TOKEN`` -> ``milvus.token``,
    ``MSGSTREAM_LOCAL_PATH`` -> ``local.path``). The unprefixed names Milvus reads
    (``MQ_TYPE``, ``KAFKA_BROKERLIST``, ``PULSAR_ADDRESS``) set only keys Milvus itself has,
    i.e. dotted keys outside this project's sections (``local``, ``msgstream``, ``milvus``):
    every such name carries its section, so a generic variable (``USER``, ``TOKEN``,
    ``ADDRESS``, ``PORT``) never maps. A prefixed name beats the unprefixed one.
    """
    milvus_keys: dict[str, str] = {}
    any_keys: dict[str, str] = {}
    for key in values:
        norm = _env_norm(key)
        any_keys[norm] = key
        section = key.split(".", 1)[0]
        if "." in key and section not in OWN_SECTIONS:
            milvus_keys[norm] = key
    out: dict[str, str] = {}
    prefixed: dict[str, str] = {}
    for name, val in env.items():
        if name.upper().startswith(ENV_PREFIX):
            key = any_keys.get(_env_norm(name[len(ENV_PREFIX):]))
            if key is not None:
                prefixed[key] = val
        else:
            key = milvus_keys.get(_env_norm(name))
            if key is not None:
                out[key] = val
    out.update(prefixed)
    return out


@dataclass
class Config:
    """Flat, lower-cased dotted keys -> values. Picklable plain data."""

    values: dict[str, Any] = field(default_factory=dict)
    source: str = "<defaults>"
    # the keys a file, the environment or an override gave (not the built-in defaults): :meth:`is_set`
    explicit: frozenset[str] = field(default_factory=frozenset, compare=False)

    # -- construction -------------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Config:
        """Load ``path`` (or the packaged embedded default), then env, then overrides.

        Precedence, lowest to highest: built-in defaults, the YAML file, environment
        variables (:func:`env_overrides`: ``KAFKA_BROKERLIST`` overrides ``kafka.brokerList``
        as in Milvus; ``MSGSTREAM_MILVUS_TOKEN`` overrides ``milvus.token``), explicit
        ``overrides`` (e.g. Spark options).
        """
        values = dict(DEFAULTS)
        if path is None:
            text = resources.files("msgstream_spark.config").joinpath("default.yaml").read_text()
            source = "<packaged default config>"
            base_dir = Path.cwd()
        else:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file not found: {p}")
            text = p.read_text()
            source = str(p)
            base_dir = p.resolve().parent
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {source} is not valid YAML: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {source} must hold a mapping at the top level")
        file_values = _flatten(data)
        _check_own_keys(file_values, source)
        values.update(file_values)
        # environment overrides (one rule, see env_overrides), for keys we know or the file has
        from_env = env_overrides(values, os.environ if env is None else env)
        values.update(from_env)
        given = frozenset(file_values) if path is not None else frozenset()  # the packaged file holds defaults
        cfg = cls(values, source, given | frozenset(from_env))
        if overrides:
            cfg = cfg.with_overrides(overrides)
        cfg._resolve_paths(base_dir)
        cfg.validate()
        return cfg

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Config:
        """Build from a nested or dotted mapping layered over the defaults."""
        values = dict(DEFAULTS)
        flat = _flatten(data)
        _check_own_keys(flat, source)
        values.update(flat)
        cfg = cls(values, source, frozenset(flat))
        cfg._resolve_paths(Path.cwd())
        cfg.validate()
        return cfg

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        flat = _flatten(overrides)
        _check_own_keys(flat, "overrides")
        new = dict(self.values)
        new.update(flat)
        cfg = Config(new, self.source, self.explicit | frozenset(flat))
        cfg.validate()
        return cfg

    def _resolve_paths(self, base_dir: Path) -> None:
        p = self.values.get("local.path")
        if p:
            pp = Path(str(p)).expanduser()
            if not pp.is_absolute():
                pp = (base_dir / pp).resolve()
            self.values["local.path"] = str(pp)

    # -- access --------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key.lower(), default)

    def __getitem__(self, key: str) -> Any:
        try:
            return self.values[key.lower()]
        except KeyError:
            raise ConfigError(f"config key {key!r} is not set ({self.source})") from None

    def __contains__(self, key: str) -> bool:
        return key.lower() in self.values

    def is_set(self, key: str) -> bool:
        """Whether ``key`` was given (by the file, a ``MSGSTREAM_`` or Milvus environment variable by
        :func:`env_overrides`'s rule, or an override), not left at its built-in default."""
        return key.lower() in self.explicit

    def get_int(self, key: str) -> int:
        v = self[key]
        try:
            return int(v)
        except (TypeError, ValueError):
            raise ConfigError(f"config key {key} must be an integer, got {v!r} ({self.source})") from None

    def get_float(self, key: str) -> float:
        v = self[key]
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"config key {key} must be a number, got {v!r} ({self.source})") from None

    def get_bool(self, key: str) -> bool:
        v = self[key]
        if isinstance(v, bool):
            return v
        s = str(v).strip().lower()
        if s in ("true", "1", "yes", "on"):
            return True
        if s in ("false", "0", "no", "off", ""):
            return False
        raise ConfigError(f"config key {key} must be true or false, got {v!r} ({self.source})")

    def get_str(self, key: str) -> str:
        v = self.get(key)
        return "" if v is None else str(v)

    def section(self, prefix: str) -> dict[str, Any]:
        """Keys below ``prefix.`` with the prefix removed (lower-cased)."""
        pre = prefix.lower().rstrip(".") + "."
        return {k[len(pre):]: v for k, v in self.values.items() if k.startswith(pre)}

    # -- selection -----------------------------------------------------------------
    @property
    def mq_type(self) -> str:
        """The backend to use, after Milvus's selection rules (wire doc §11.1)."""
        t = self.get_str("mq.type").strip().lower() or "default"
        if t == "rocksmq":  # the embedded log plays RocksMQ's role
            return "local"
        if t != "default":
            return t
        standalone = self.get_str("msgstream.mode").strip().lower() != "cluster"
        if standalone and self.get_str("local.path"):
            return "local"
        if self.get_str("pulsar.address"):
            return "pulsar"
        if self.get_str("kafka.brokerlist"):
            return "kafka"
        raise ConfigError(
            f"mq.type is 'default' but no backend is configured ({self.source}): set "
            "local.path (standalone), pulsar.address or kafka.brokerList, or mq.type"
        )

    def dml_channel_names(self, count: int | None = None) -> list[str]:
        """``<cluster>-<rootCoordDml>_<i>`` names, as Milvus builds its pchannels."""
        n = self.get_int("rootcoord.dmlchannelnum") if count is None else count
        prefix = (f"{self.get_str('msgchannel.channameprefix.cluster')}-"
                  f"{self.get_str('msgchannel.channameprefix.rootcoorddml')}")
        return [f"{prefix}_{i}" for i in range(n)]

    # -- validation / printing -------------------------------------------------------
    def validate(self) -> None:
        t = self.get_str("mq.type").strip().lower()
        if t not in VALID_MQ_TYPES:
            raise ConfigError(
                f"config key mq.type has unknown backend {t!r} ({self.source}); valid: "
                + ", ".join(VALID_MQ_TYPES)
            )
        mode = self.get_str("msgstream.mode").strip().lower()
        if mode not in ("standalone", "cluster"):
            raise ConfigError(
                f"config key msgstream.mode must be standalone or cluster, got {mode!r} ({self.source})"
            )
        for key in ("local.retentiontimeinminutes", "local.retentionsizeinmb", "local.busytimeout", "local.mmapsizemb",
                    "kafka.readtimeout", "pulsar.requesttimeout", "pulsar.maxmessagesize",
                    "pulsar.port", "rootcoord.dmlchannelnum"):
            v = self.get_float(key)
            if v < 0:
                raise ConfigError(f"config key {key} must be >= 0, got {v} ({self.source})")

    def masked(self) -> dict[str, Any]:
        """All values with secrets replaced by ``******`` (for printing and logs)."""
        return mask_mapping(dict(sorted(self.values.items())))

    def __repr__(self) -> str:
        return f"Config(source={self.source!r}, mq.type={self.get_str('mq.type')!r}, ...)"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)


def _check_own_keys(flat: Iterable[str], source: str) -> None:
    known = {k for k in DEFAULTS}
    for key in flat:
        section = key.split(".", 1)[0]
        if section in OWN_SECTIONS and key not in known:
            own = sorted(k for k in known if k.startswith(section + "."))
            raise ConfigError(
                f"unknown config key {key!r} in {source}; known keys of section "
                f"'{section}': {', '.join(own)}"
            )
