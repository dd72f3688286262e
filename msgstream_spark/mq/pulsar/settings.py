"""pulsar-client options from Milvus's ``pulsar.*`` keys (wire doc §4.2, §11.3).

``pulsar.address`` becomes ``pulsar://<address>:<port>`` unless it already carries a scheme or
port (as Milvus does); ``pulsar.requestTimeout`` bounds every broker operation; ``authPlugin``
/ ``authParams`` select token or TLS authentication. The token never reaches a log, an error
or ``repr``; ``pulsar.client.*`` pass-through keys go to ``pulsar.Client`` as keyword arguments.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

from msgstream_spark.config import Config, mask_value
from msgstream_spark.errors import ConfigError

log = logging.getLogger(__name__)

_TOKEN_PLUGINS = ("token", "org.apache.pulsar.client.impl.auth.authenticationtoken")
_TLS_PLUGINS = ("tls", "org.apache.pulsar.client.impl.auth.authenticationtls")


def parse_auth_params(raw: str, source: str) -> dict[str, str]:
    """``k1:v1,k2:v2`` (Milvus's form) or a JSON object."""
    raw = raw.strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ConfigError(f"config key pulsar.authParams is not valid JSON ({source})") from None
        return {str(k): str(v) for k, v in parsed.items()}
    out: dict[str, str] = {}
    for part in raw.split(","):
        key, sep, value = part.partition(":")
        if not sep or not key.strip():
            raise ConfigError(f"config key pulsar.authParams must look like 'key:value,key:value' ({source}); "
                              f"got an entry without a key")
        out[key.strip()] = value.strip()
    return out


def _token_of(params: dict[str, str], source: str) -> str:
    """The JWT of ``token:<jwt>``, or read from ``file:<path>``."""
    if not params.get("file"):
        return params.get("token", "")
    try:
        with open(params["file"].removeprefix("file://")) as fh:
            return fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"config key pulsar.authParams: cannot read the token file "
                          f"({exc.strerror}) ({source})") from None


class PulsarSettings:
    def __init__(self, config: Config) -> None:
        address = config.get_str("pulsar.address").strip()
        if not address:
            raise ConfigError(f"config key pulsar.address is empty ({config.source})")
        port = config.get_int("pulsar.port")
        if "://" in address:
            self.service_url = address
        elif ":" in address:
            self.service_url = f"pulsar://{address}"
        else:
            self.service_url = f"pulsar://{address}:{port}"
        parts = urlsplit(self.service_url)
        if parts.scheme not in ("pulsar", "pulsar+ssl") or not parts.hostname:
            raise ConfigError(f"config key pulsar.address gives an invalid service URL {self.service_url!r} "
                              f"({config.source}); expected pulsar://host:port or pulsar+ssl://host:port")
        self.host = parts.hostname
        self.tenant = config.get_str("pulsar.tenant").strip() or "public"
        self.namespace = config.get_str("pulsar.namespace").strip() or "default"
        self.request_timeout = config.get_float("pulsar.requesttimeout")
        if self.request_timeout <= 0:
            raise ConfigError(f"config key pulsar.requestTimeout must be > 0, got {self.request_timeout} "
                              f"({config.source})")
        self.max_message_size = config.get_int("pulsar.maxmessagesize")
        self.web_port = config.get_int("pulsar.webport")
        scheme = "https" if parts.scheme == "pulsar+ssl" else "http"
        self.web_url = f"{scheme}://{self.host}:{self.web_port}"
        self.tls_trust_certs = config.get_str("pulsar.tlstrustcertspath")
        self.tls_allow_insecure = config.get_bool("pulsar.tlsallowinsecureconnection")
        self.tls_validate_hostname = config.get_bool("pulsar.tlsvalidatehostname")
        plugin = config.get_str("pulsar.authplugin").strip()
        params = parse_auth_params(config.get_str("pulsar.authparams"), config.source)
        self.auth_kind = ""
        self._token = ""
        self._tls: tuple[str, str] | None = None
        low = plugin.lower()
        if not plugin:
            if params:
                raise ConfigError(f"config key pulsar.authParams is set but pulsar.authPlugin is empty "
                                  f"({config.source}); set authPlugin to token or tls")
        elif low in _TOKEN_PLUGINS:
            token = _token_of(params, config.source)
            if not token:
                raise ConfigError(f"config key pulsar.authParams needs token:<jwt> (or file:<path>) when "
                                  f"pulsar.authPlugin is token ({config.source})")
            self.auth_kind, self._token = "token", token
        elif low in _TLS_PLUGINS:
            cert, key = params.get("tlsCertFile", ""), params.get("tlsKeyFile", "")
            if not cert or not key:
                raise ConfigError(f"config key pulsar.authParams needs tlsCertFile:<path>,tlsKeyFile:<path> when "
                                  f"pulsar.authPlugin is tls ({config.source})")
            self.auth_kind, self._tls = "tls", (cert, key)
        else:
            raise ConfigError(f"config key pulsar.authPlugin has unsupported value {plugin!r} ({config.source}); "
                              f"supported: token, tls (or their org.apache.pulsar class names)")
        self.client_overrides: dict[str, Any] = dict(config.section("pulsar.client").items())

    def topic(self, channel: str) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{channel}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pulsar.Client`` (holds the secret: never log the result)."""
        import pulsar

        kw: dict[str, Any] = {
            "operation_timeout_seconds": max(1, int(round(self.request_timeout))),
            "connection_timeout_ms": int(self.request_timeout * 1000),
            "tls_allow_insecure_connection": self.tls_allow_insecure,
            "tls_validate_hostname": self.tls_validate_hostname,
            "logger": _client_logger(),
        }
        if self.tls_trust_certs:
            kw["tls_trust_certs_file_path"] = self.tls_trust_certs
        if self.auth_kind == "token":
            kw["authentication"] = pulsar.AuthenticationToken(self._token)
        elif self.auth_kind == "tls" and self._tls:
            kw["authentication"] = pulsar.AuthenticationTLS(*self._tls)
        for k, v in self.client_overrides.items():
            log.info("pulsar.client.%s overrides the client option (value %s)", k, mask_value(k, v))
            kw[k] = v
        return kw

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self.auth_kind == "token" else {}

    def describe(self) -> str:
        """Where we connect and how, without secrets (for errors and logs)."""
        auth = f", auth={self.auth_kind} (credentials hidden)" if self.auth_kind else ""
        return f"{self.service_url}, {self.tenant}/{self.namespace}{auth}"

    def __repr__(self) -> str:
        return f"PulsarSettings({self.describe()})"

    def __getstate__(self) -> dict:  # picklable, and the token survives the trip (it is needed remotely)
        return dict(self.__dict__)


def _client_logger():
    """The C++ client's own console logger at WARN: a Python logger would take the interpreter
    lock for every log-level check on the I/O threads (a several-fold throughput loss)."""
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
