"""Backend name -> builder registry with lazy imports.

A backend's client library is imported only when that backend is built, so a
missing optional client breaks only that backend, with an error naming the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from msgstream_spark.errors import BackendUnavailableError

if TYPE_CHECKING:
    from msgstream_spark.config import Config
    from msgstream_spark.mq.base import Client

# name -> (module path of the backend's client module, class name, pip extra, client module)
_BACKENDS: dict[str, tuple[str, str, str | None, str | None]] = {
    "local": ("msgstream_spark.mq.local.client", "LocalClient", None, None),
    "kafka": ("msgstream_spark.mq.kafka.client", "KafkaClient", "kafka", "confluent_kafka"),
    "pulsar": ("msgstream_spark.mq.pulsar.client", "PulsarClient", "pulsar", "pulsar"),
    "milvus": ("msgstream_spark.mq.milvus.client", "MilvusClient", "milvus", "grpc"),
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def build_client(name: str, config: Config) -> Client:
    """Create the :class:`Client` of backend ``name`` from ``config`` (no I/O yet)."""
    try:
        module, cls, extra, client_module = _BACKENDS[name]
    except KeyError:
        raise BackendUnavailableError(
            f"unknown backend {name!r}; valid backends: {', '.join(available_backends())}"
        ) from None
    if client_module is not None:
        try:
            importlib.import_module(client_module)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"backend {name!r} needs the Python package {client_module!r}: "
                f"pip install 'msgstream-spark[{extra}]'"
            ) from exc
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise BackendUnavailableError(
                f"backend {name!r} is not available in this version of msgstream-spark "
                f"(working backends: {', '.join(b for b in available_backends() if _present(b))})"
            ) from exc
        raise
    return getattr(mod, cls)(config)


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(_BACKENDS[name][0]) is not None
    except ModuleNotFoundError:
        return False
