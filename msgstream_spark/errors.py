"""One exception root for the whole library, with subclasses by area.

Backend errors are always re-raised ``from`` the original client exception so the
cause stays visible. Messages name what was wrong and where (channel, position,
option, config key); they never contain secrets.
"""

from __future__ import annotations

import base64


class MsgStreamError(Exception):
    """Root of every error raised by msgstream-spark."""


class ConfigError(MsgStreamError):
    """Bad or missing configuration (a key, a value, a file)."""


class OptionError(ConfigError):
    """A bad Spark data source option (names the option and the accepted values)."""


class BackendError(MsgStreamError):
    """A message-queue backend failed (connection, timeout, broker error)."""


class BackendUnavailableError(BackendError):
    """A backend cannot be used: its optional client library is not installed, the name is unknown,
    or none of its brokers accepts connections."""


class ChannelNotFoundError(BackendError):
    """A channel (topic) does not exist and could not be created."""


class ProduceError(BackendError):
    """Producing failed. For batched sends, ``failures`` lists every failed message.

    ``failures`` is a list of ``(index, reason)`` for the messages of the batch that
    were not written; ``ids`` holds the message ids of those that were (``None`` for
    failed slots), so nothing is reported as written that was not.
    """

    def __init__(self, message: str, *, channel: str | None = None,
                 failures: list[tuple[int, str]] | None = None,
                 ids: list | None = None) -> None:
        super().__init__(message)
        self.channel = channel
        self.failures = failures or []
        self.ids = ids or []


class ConsumeError(BackendError):
    """Consuming or seeking failed."""


class BackendTimeoutError(BackendError):
    """A backend call did not finish within its configured timeout."""


class DataLossError(MsgStreamError):
    """Requested data is gone (removed by retention, channel deleted)."""

    def __init__(self, message: str, *, channel: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel


class DecodeError(MsgStreamError):
    """A message payload could not be decoded.

    Carries the channel, the position (message id bytes, if known) and the raw
    payload so the corrupt message can be found and inspected.
    """

    def __init__(self, message: str, *, channel: str | None = None,
                 msg_id: bytes | None = None, payload: bytes | None = None) -> None:
        self.reason = message
        self.channel = channel
        self.msg_id = msg_id
        self.payload = payload
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.reason]
        if self.channel is not None:
            parts.append(f"channel={self.channel}")
        if self.msg_id is not None:
            parts.append(f"msgID(base64)={base64.b64encode(self.msg_id).decode()}")
        if self.payload is not None:
            shown = self.payload[:64]
            more = "..." if len(self.payload) > 64 else ""
            parts.append(f"payload({len(self.payload)} bytes, base64)="
                         f"{base64.b64encode(shown).decode()}{more}")
        return "; ".join(parts)

    def with_location(self, channel: str | None, msg_id: bytes | None) -> DecodeError:
        """Return a copy of this error that also names where the message was read."""
        err = type(self)(self.reason, channel=channel or self.channel,
                          msg_id=msg_id if msg_id is not None else self.msg_id,
                          payload=self.payload)
        err.__cause__ = self.__cause__
        return err


class UnknownMessageTypeError(DecodeError):
    """The payload names a message type this library does not decode."""


class SchemaError(MsgStreamError):
    """Data does not fit a collection schema (type, dimension, null primary key)."""


class MirrorError(MsgStreamError):
    """A mirrored table cannot take a change: it belongs to another collection (name, id, primary key or
    column types differ), a column type cannot evolve, or a table format library is missing."""
