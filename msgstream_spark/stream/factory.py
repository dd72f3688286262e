"""The factory: one config in, clients and streams of the configured backend out."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from msgstream_spark.config.loader import Config
from msgstream_spark.mq.base import Client
from msgstream_spark.mq.registry import build_client
from msgstream_spark.stream.msgstream import MsgStream
from msgstream_spark.stream.ttstream import TtMsgStream


class Factory:
    """Builds clients and msgstreams for the backend ``config`` selects (wire doc §11.1).

    Construction does no I/O; each call opens what it returns, and the caller closes it.
    """

    def __init__(self, config: Config | str | os.PathLike[str] | Mapping[str, Any] | None = None,
                 **overrides: Any) -> None:
        if isinstance(config, Config):
            cfg = config.with_overrides(overrides) if overrides else config
        elif isinstance(config, Mapping):
            cfg = Config.from_dict(config)
            if overrides:
                cfg = cfg.with_overrides(overrides)
        else:
            cfg = Config.load(config, overrides=overrides or None)
        self.config = cfg

    @property
    def backend(self) -> str:
        return self.config.mq_type

    def client(self) -> Client:
        return build_client(self.backend, self.config)

    def msgstream(self, **kwargs: Any) -> MsgStream:
        """A plain :class:`~msgstream_spark.stream.MsgStream` owning a new client."""
        return MsgStream(self.client(), **kwargs)

    def tt_msgstream(self, **kwargs: Any) -> TtMsgStream:
        """A time-tick aligned :class:`~msgstream_spark.stream.TtMsgStream` owning a new client."""
        return TtMsgStream(self.client(), **kwargs)

    def __repr__(self) -> str:
        return f"Factory(backend={self.config.get_str('mq.type')!r}, source={self.config.source!r})"
