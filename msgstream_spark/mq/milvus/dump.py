"""One ``DumpMessages`` server stream, drained by a thread so that reads have a timeout.

gRPC's stream iterator blocks without a bound; a daemon thread moves its items into a bounded
queue, and ``get(timeout)`` waits at most ``timeout``. ``close()`` cancels the call, which ends the
thread. Items are :class:`Entry` (one ``ImmutableMessage``), :data:`END` (the server ended the stream
cleanly: ``end_timetick`` reached) or the exception that ended it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any

from msgstream_spark.mq.milvus.connection import pb_modules
from msgstream_spark.msg.wal26 import WalMessageId, WALName

END = object()
_PUT_POLL = 0.2


@dataclass(frozen=True)
class DumpRequest:
    pchannel: str
    start: WalMessageId
    include_start: bool = True
    start_timetick: int = 0
    end_timetick: int = 0

    def to_proto(self) -> Any:
        common_pb2, milvus_pb2, _ = pb_modules()
        return milvus_pb2.DumpMessagesRequest(
            pchannel=self.pchannel,
            start_message_id=common_pb2.MessageID(id=self.start.id, WAL_name=int(self.start.wal)),
            start_timetick=self.start_timetick, end_timetick=self.end_timetick,
            include_start_message=self.include_start)


@dataclass(frozen=True)
class Entry:
    id: WalMessageId
    payload: bytes
    properties: dict


class StatusFailure(Exception):
    """The server sent a ``status`` response (Milvus never does; kept for other servers)."""

    def __init__(self, status: Any) -> None:
        super().__init__(status.reason or f"status code {status.code or status.error_code}")
        self.status = status


class DumpStream:
    def __init__(self, call: Any, maxsize: int = 4096) -> None:
        self._call = call
        self._q: queue.Queue = queue.Queue(maxsize=maxsize)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="milvus-dump", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._closed.is_set():
            try:
                self._q.put(item, timeout=_PUT_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self) -> None:
        try:
            for resp in self._call:
                if resp.WhichOneof("response") == "status":
                    if resp.status.code or resp.status.error_code:
                        self._put(StatusFailure(resp.status))
                        return
                    continue
                m = resp.message
                entry = Entry(WalMessageId(WALName(m.id.WAL_name) if m.id.WAL_name in WALName._value2member_map_
                                           else WALName.Unknown, m.id.id), bytes(m.payload), dict(m.properties))
                if not self._put(entry):
                    return
            self._put(END)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which translates it
            if not self._closed.is_set():
                self._put(exc)

    def get(self, timeout: float) -> object | None:
        """The next item, or ``None`` if none came within ``timeout`` seconds."""
        try:
            return self._q.get(timeout=max(0.0, timeout)) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            with contextlib.suppress(Exception):  # a finished call cannot be cancelled: nothing to do
                self._call.cancel()
