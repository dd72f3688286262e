"""librdkafka configuration from Milvus's ``kafka.*`` keys (wire doc §4.1, §11.4).

Our defaults follow Milvus's producer and consumer settings; ``kafka.producer.*`` and
``kafka.consumer.*`` pass-through keys are applied last, and every default they override
is logged (with secret values masked). The SASL password never reaches a log or error.
Every client logs through Python logging (logs.py), and its broker calls go through ``call``
(reach.py): a broker list that refuses connections fails within seconds, not at the timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from msgstream_spark.config import Config, mask_value
from msgstream_spark.errors import ConfigError
from msgstream_spark.mq.kafka.logs import librdkafka_logger
from msgstream_spark.mq.kafka.reach import bounded

T = TypeVar("T")

log = logging.getLogger(__name__)


class KafkaSettings:
    def __init__(self, config: Config) -> None:
        brokers = config.get_str("kafka.brokerlist").strip()
        if not brokers:
            raise ConfigError(f"config key kafka.brokerList is empty ({config.source})")
        self.brokers = brokers
        self.read_timeout = config.get_float("kafka.readtimeout")
        self.request_timeout = config.get_float("kafka.requesttimeout")
        self.create_topics = config.get_bool("kafka.createtopics")
        self.partitions = config.get_int("kafka.topicpartitions")
        self.replication = config.get_int("kafka.topicreplicationfactor")
        user = config.get_str("kafka.saslusername")
        password = config.get_str("kafka.saslpassword")
        if bool(user) != bool(password):
            raise ConfigError(f"config keys kafka.saslUsername and kafka.saslPassword must be set together "
                              f"({config.source})")
        base: dict[str, Any] = {
            "bootstrap.servers": brokers, "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 5000,
            "socket.timeout.ms": int(self.request_timeout * 1000),
        }
        if config.get_str("kafka.securityprotocol"):
            base["security.protocol"] = config.get_str("kafka.securityprotocol")
        if user:
            base["sasl.mechanisms"] = config.get_str("kafka.saslmechanisms") or "PLAIN"
            base["sasl.username"] = user
            base["sasl.password"] = password
        if config.get_bool("kafka.ssl.enabled"):
            for ours, theirs in (("kafka.ssl.tlscert", "ssl.certificate.location"),
                                 ("kafka.ssl.tlskey", "ssl.key.location"),
                                 ("kafka.ssl.tlscacert", "ssl.ca.location"),
                                 ("kafka.ssl.tlskeypassword", "ssl.key.password")):
                if config.get_str(ours):
                    base[theirs] = config.get_str(ours)
        self.base = base
        self.producer_overrides = {k: v for k, v in config.section("kafka.producer").items()}
        self.consumer_overrides = {k: v for k, v in config.section("kafka.consumer").items()}

    def call(self, what: str, fn: Callable[[float], T]) -> T:
        """``fn(timeout)`` bounded by kafka.requestTimeout, failing at once when no broker accepts connections."""
        return bounded(self.brokers, self.request_timeout, what, fn)

    def _merge(self, defaults: dict[str, Any], overrides: dict[str, Any], role: str) -> dict[str, Any]:
        out = {**defaults, "logger": librdkafka_logger()}
        for k, v in overrides.items():
            if k in out and str(out[k]) != str(v):
                log.info("kafka.%s.%s overrides our default %s -> %s", role, k, mask_value(k, out[k]),
                         mask_value(k, v))
            out[k] = v
        return out

    def producer_conf(self) -> dict[str, Any]:
        return self._merge({**self.base, "message.max.bytes": 10485760, "compression.codec": "zstd",
                            "linger.ms": 2, "enable.idempotence": True,
                            "message.timeout.ms": int(self.request_timeout * 1000)},
                           self.producer_overrides, "producer")

    def consumer_conf(self, group: str) -> dict[str, Any]:
        return self._merge({**self.base, "group.id": group, "enable.auto.commit": False,
                            "allow.auto.create.topics": True, "auto.offset.reset": "error",
                            "enable.partition.eof": False,
                            # librdkafka fetches 1 MiB per partition per request by default: two
                            # 1000-row inserts a round trip. 16 MiB reads large logs ~20% faster
                            # (bench/profile_read.py); the fetch queue stays bounded by
                            # queued.max.messages.kbytes.
                            "max.partition.fetch.bytes": 16 * 1024 * 1024},
                           self.consumer_overrides, "consumer")

    def admin_conf(self) -> dict[str, Any]:
        return {**self.base, "logger": librdkafka_logger()}

    def describe(self) -> str:
        """The brokers and security settings, with secrets masked (for errors and logs)."""
        return ", ".join(f"{k}={mask_value(k, v)}" for k, v in self.base.items() if k != "socket.timeout.ms")
