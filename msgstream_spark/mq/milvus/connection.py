"""One gRPC connection to a Milvus proxy, opened as Milvus's SDKs open it.

``Connect`` first (it checks the ``dbname`` header and returns an ``identifier``, a fresh TSO), then
every call carries ``authorization`` (base64 token or ``user:password``), ``dbname`` and that
``identifier`` as pymilvus does. gRPC is imported lazily. Failures become this library's errors:
UNIMPLEMENTED names the Milvus versions that serve ``DumpMessages``, UNAUTHENTICATED names the
config keys (never their values), every unary call is bounded by ``milvus.requestTimeout``.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from msgstream_spark.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ConfigError,
    MsgStreamError,
)
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg import pb

SERVING_VERSIONS = ("Milvus 2.6 proxies built since 2026-03-30 (PR #48527; include_start_message and "
                    "transactions as separate messages since 2026-07-10, PR #51102) and Milvus 3.0")


class ProxyDown(BackendUnavailableError):
    """The proxy cannot be reached right now (gRPC UNAVAILABLE): worth retrying, within a bound."""


class AuthError(BackendError, ConfigError):
    """The proxy refused the credentials (names the config keys, never their values)."""


def pb_modules() -> tuple[Any, Any, Any]:
    """Milvus's generated modules (loaded as msg.pb loads them: no pymilvus client import)."""
    milvus_pb2 = pb._load("milvus_pb2")
    if not hasattr(milvus_pb2, "DumpMessagesRequest"):
        raise BackendUnavailableError("the milvus backend needs pymilvus >= 3.0 (its protos carry DumpMessages): "
                                      "pip install -U 'pymilvus>=3'")
    return pb.common_pb2, milvus_pb2, pb._load("milvus_pb2_grpc")


def rpc_error(settings: MilvusSettings, what: str, exc: Exception) -> MsgStreamError:
    """A library error for a failed gRPC call ``what``; the cause's text never holds a secret of ours."""
    import grpc

    code = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
    detail = exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else str(exc)
    where = f"Milvus proxy {settings.address}"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return BackendUnavailableError(
            f"{where} does not serve {what} (gRPC UNIMPLEMENTED): the DumpMessages WAL stream is served by "
            f"{SERVING_VERSIONS}; upgrade the proxy, or read the cluster's Kafka or Pulsar directly "
            "(mq.type=kafka|pulsar)")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthError(f"{where} refused {what} ({code.name}): check milvus.token, or milvus.user and "
                         f"milvus.password ({settings.describe()}): {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendTimeoutError(f"{what} on {where} did not finish within milvus.requestTimeout="
                                   f"{settings.request_timeout:g}s")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ProxyDown(f"{where} is unavailable during {what}: {detail}")
    name = code.name if code is not None else type(exc).__name__
    return BackendError(f"{what} on {where} failed ({name}): {detail}")


def status_error(settings: MilvusSettings, what: str, status: Any) -> MsgStreamError | None:
    """An error for a non-success ``common.Status`` (``None`` on success)."""
    if status is None or (status.code == 0 and status.error_code == 0):
        return None
    where = f"Milvus proxy {settings.address}"
    reason = status.reason or "no reason given"
    if status.code in (1800, 1801) or status.error_code in (3, 43):  # need authenticate / auth failures
        return AuthError(f"{where} refused {what}: {reason}: check milvus.token, or milvus.user and "
                         f"milvus.password ({settings.describe()})")
    return BackendError(f"{what} failed on {where} (Milvus status {status.code or status.error_code}): {reason}")


class ProxyConnection:
    """A gRPC channel and stub, ``Connect``-ed once; thread-safe, reopened after ``close``."""

    def __init__(self, settings: MilvusSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stub: Any = None
        self.identifier: int | None = None

    def _open_channel(self) -> Any:
        import grpc

        s = self.settings
        opts = [("grpc.keepalive_time_ms", int(s.keepalive_time * 1000)),
                ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.max_receive_message_length", 256 << 20),
                ("grpc.enable_retries", 0)]
        if not s.tls:
            return grpc.insecure_channel(s.address, options=opts)
        if s.server_name:
            opts.append(("grpc.ssl_target_name_override", s.server_name))

        def read(path: str) -> bytes | None:
            if not path:
                return None
            try:
                with open(path, "rb") as fh:
                    return fh.read()
            except OSError as exc:
                raise ConfigError(f"cannot read TLS file {path} (milvus.tls.*): {exc.strerror}") from None

        creds = grpc.ssl_channel_credentials(read(s.ca_cert), read(s.client_key), read(s.client_cert))
        return grpc.secure_channel(s.address, creds, options=opts)

    def metadata(self) -> list[tuple[str, str]]:
        md = []
        auth = self.settings.authorization()
        if auth:
            md.append(("authorization", auth))
        if self.settings.database:
            md.append(("dbname", self.settings.database))
        if self.identifier is not None:
            md.append(("identifier", str(self.identifier)))
        return md

    def stub(self) -> Any:
        with self._lock:
            if self._stub is None:
                _, _, grpc_mod = pb_modules()
                self._channel = self._open_channel()
                self._stub = grpc_mod.MilvusServiceStub(self._channel)
                self.identifier = None
                self._connect()
            return self._stub

    def _connect(self) -> None:
        common_pb2, milvus_pb2, _ = pb_modules()
        req = milvus_pb2.ConnectRequest(client_info=common_pb2.ClientInfo(
            sdk_type="Python", sdk_version="msgstream-spark", local_time="", user=self.settings.user,
            host=socket.gethostname()))
        try:
            resp = self._stub.Connect(req, timeout=self.settings.request_timeout, metadata=self.metadata())
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError, translated
            self._drop()
            raise rpc_error(self.settings, "Connect", exc) from None
        err = status_error(self.settings, "Connect", resp.status)
        if err is not None:
            self._drop()
            raise err
        self.identifier = int(resp.identifier)

    def fresh_tso(self) -> int:
        """A fresh TSO from the proxy (``Connect``'s identifier): "now" in the cluster's clock."""
        self.stub()
        with self._lock:
            self._connect()
            return int(self.identifier or 0)

    def unary(self, what: str, method: str, request: Any) -> Any:
        stub = self.stub()
        try:
            return getattr(stub, method)(request, timeout=self.settings.request_timeout, metadata=self.metadata())
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError, translated
            raise rpc_error(self.settings, what, exc) from None

    def open_stream(self, request: Any) -> Any:
        """A ``DumpMessages`` server stream (cancel it to stop); no deadline: the caller's watchdog bounds it."""
        return self.stub().DumpMessages(request, metadata=self.metadata())

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def close(self) -> None:
        with self._lock:
            self._drop()
