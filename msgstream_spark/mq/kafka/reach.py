"""Broker calls that fail within seconds when no bootstrap server accepts connections.

librdkafka keeps retrying a refused connection until the call's timeout (``kafka.requestTimeout``,
30 s by default) and then reports a bare transport failure. ``bounded`` runs such a call with a
short first attempt; if that fails for want of a broker, it asks every server of
``kafka.brokerList`` for a TCP connection itself. When all of them refuse (or do not resolve)
nothing can succeed and :class:`BackendUnavailableError` says so at once, naming the list.
A broker that accepts connections but does not answer (overloaded, paused) is waited for up to
the configured timeout, as before.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

from msgstream_spark.errors import BackendUnavailableError

T = TypeVar("T")

_FIRST_ATTEMPT_S = 1.0  # the first try; a refused broker list is diagnosed after it
_CONNECT_TIMEOUT_S = 1.0  # per bootstrap server, for our own TCP check
_RETRY_PAUSE_S = 0.1  # between attempts that failed at once (no busy loop)


def _transient_codes() -> set[int]:
    from confluent_kafka import KafkaError

    return {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE,
            KafkaError._WAIT_COORD}


def _servers(brokers: str) -> list[tuple[str, int]]:
    out = []
    for item in brokers.split(","):
        item = item.strip().rsplit("://", 1)[-1]
        host, sep, port = item.rpartition(":")
        if sep and port.isdigit():
            out.append((host.strip("[]") or "localhost", int(port)))
    return out


def refusals(brokers: str) -> list[str] | None:
    """Why each bootstrap server cannot be reached, or None when one accepts (or may accept) a connection."""
    servers = _servers(brokers)
    if not servers:
        return None
    reasons = []
    for host, port in servers:
        try:
            with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
                return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port}: connection refused")
        except socket.gaierror as exc:
            reasons.append(f"{host}:{port}: cannot resolve {host!r} ({exc.strerror})")
        except OSError:  # a timeout or an unreachable route may be slowness: bounded by the timeout
            return None
    return reasons


def bounded(brokers: str, timeout: float, what: str, call: Callable[[float], T]) -> T:
    """``call(t)`` until it succeeds within ``timeout`` s in all; KafkaError transport failures are
    retried, and diagnosed after the first attempt (BackendUnavailableError when every server refuses).
    Other errors, and the last failure at the deadline, propagate unchanged."""
    from confluent_kafka import KafkaException

    transient = _transient_codes()
    deadline = time.monotonic() + timeout
    attempt = min(timeout, _FIRST_ATTEMPT_S)
    checked = False
    while True:
        started = time.monotonic()
        try:
            return call(max(attempt, 0.001))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() not in transient:
                raise
            if not checked:
                checked = True
                down = refusals(brokers)
                if down:
                    raise BackendUnavailableError(
                        f"{what}: no Kafka broker accepts connections - every server of kafka.brokerList "
                        f"({brokers}) refused: {'; '.join(down)}") from exc
            now = time.monotonic()
            if now >= deadline:
                raise
            if now - started < _RETRY_PAUSE_S:
                time.sleep(min(_RETRY_PAUSE_S, deadline - now))
            attempt = deadline - time.monotonic()
