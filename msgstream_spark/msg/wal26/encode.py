"""Write Milvus 2.6 WAL messages: properties, ``_h`` headers and TimeTick bodies (wal doc §2, §3, §5, §6, §8).

The write-side twin of :mod:`~msgstream_spark.msg.wal26.envelope`. A version-1 Insert or Delete
keeps its legacy ``msgpb`` body (the sink's encoder builds it); what 2.6 adds is here: the
reserved properties (``_v``, ``_t``, ``_tt`` in base 36, ``_vc``, ``_h`` as base64 of the header
protobuf, ``_tx``, ``_lc`` / ``_lcs``) and the ``messagespb`` headers, written with a small
proto3 field writer (pymilvus ships none of these protos; default values are not written).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable

from msgstream_spark.msg.pb import common_pb2, msg_pb2
from msgstream_spark.msg.wal26.envelope import (
    HEADER,
    LAST_CONFIRMED,
    LAST_CONFIRMED_SELF,
    TIME_TICK,
    TXN,
    TYPE,
    VCHANNEL,
    VERSION,
    WAL_TERM,
)
from msgstream_spark.msg.wal26.headers import PartitionSegmentAssignment
from msgstream_spark.msg.wal26.types import WalMessageType, b36encode
from msgstream_spark.msg.wire import encode_varint

T = WalMessageType
DEFAULT_KEEPALIVE_MS = 10_000  # the streamingnode's default transaction keepalive


# -- proto3 field writer -------------------------------------------------------------------------------
def _varint_field(number: int, value: int) -> bytes:
    """A varint field; proto3 leaves a zero (or false) value out."""
    return encode_varint(number << 3) + encode_varint(int(value)) if value else b""


def _bytes_field(number: int, data: bytes, *, keep_empty: bool = False) -> bytes:
    """A length-delimited field; an empty value is left out unless it is a set sub-message."""
    if not data and not keep_empty:
        return b""
    return encode_varint(number << 3 | 2) + encode_varint(len(data)) + data


def b64(data: bytes) -> str:
    """Standard, padded base64 (how ``_h``, ``_tx`` and ``_bh`` are written)."""
    return base64.standard_b64encode(bytes(data)).decode("ascii")


# -- headers (messages.proto, wal doc §8) --------------------------------------------------------------
def insert_header(collection_id: int, partitions: Iterable[PartitionSegmentAssignment]) -> bytes:
    """``InsertMessageHeader{collection_id = 1, partitions = 2}`` as a streamingnode writes it.

    Each entry is ``{partition_id = 1, rows = 2, binary_size = 3, segment_assignment = 4 {segment_id = 1}}``;
    ``segment_assignment`` is present whenever a segment is assigned (segment 0 = none: Milvus's
    proxy sends the header that way and the streamingnode fills it in).
    """
    out = _varint_field(1, collection_id)
    for p in partitions:
        entry = _varint_field(1, p.partition_id) + _varint_field(2, p.rows) + _varint_field(3, p.binary_size)
        if p.segment_id:
            entry += _bytes_field(4, _varint_field(1, p.segment_id), keep_empty=True)
        out += _bytes_field(2, entry, keep_empty=True)
    return out


def delete_header(collection_id: int, rows: int) -> bytes:
    """``DeleteMessageHeader{collection_id = 1, rows = 2}``."""
    return _varint_field(1, collection_id) + _varint_field(2, rows)


def txn_context(txn_id: int, keepalive_ms: int) -> bytes:
    """``TxnContext{txn_id = 1, keepalive_milliseconds = 2}`` (the ``_tx`` property)."""
    return _varint_field(1, txn_id) + _varint_field(2, keepalive_ms)


def begin_txn_header(keepalive_ms: int = 0) -> bytes:
    """``BeginTxnMessageHeader{keepalive_milliseconds = 1}``; proxies write 0 (the ``_tx`` value counts)."""
    return _varint_field(1, keepalive_ms)


# -- properties ----------------------------------------------------------------------------------------
def properties(msg_type: int, time_tick: int, *, version: int = 1, vchannel: str | None = None,
               header: bytes = b"", last_confirmed: str | None = None, last_confirmed_self: bool = False,
               txn: bytes | None = None, wal_term: int | None = None) -> dict[str, str]:
    """The reserved properties of one WAL message.

    ``_h`` is always present (``""`` for an empty header); ``_vc`` is left out for a message
    meant for every vchannel (a TimeTick); ``_lcs`` (a flag, value ``""``) and ``_lc`` exclude
    each other.
    """
    if last_confirmed is not None and last_confirmed_self:
        raise ValueError("a WAL message carries _lc or _lcs, not both")
    p = {VERSION: str(int(version)), TYPE: str(int(msg_type)), TIME_TICK: b36encode(time_tick), HEADER: b64(header)}
    if vchannel:
        p[VCHANNEL] = vchannel
    if wal_term is not None:
        p[WAL_TERM] = b36encode(wal_term)
    if last_confirmed_self:
        p[LAST_CONFIRMED_SELF] = ""
    elif last_confirmed is not None:
        p[LAST_CONFIRMED] = last_confirmed
    if txn is not None:
        p[TXN] = b64(txn)
    return p


def insert_properties(time_tick: int, vchannel: str, collection_id: int, partition_id: int, *, rows: int,
                      binary_size: int, segment_id: int, **kw) -> dict[str, str]:
    """An Insert (version 1): ``_h`` assigns ``segment_id`` to the body's partition."""
    header = insert_header(collection_id, [PartitionSegmentAssignment(partition_id, rows, binary_size, segment_id)])
    return properties(T.Insert, time_tick, vchannel=vchannel, header=header, **kw)


def delete_properties(time_tick: int, vchannel: str, collection_id: int, *, rows: int, **kw) -> dict[str, str]:
    """A Delete (version 1) with its ``DeleteMessageHeader``."""
    return properties(T.Delete, time_tick, vchannel=vchannel, header=delete_header(collection_id, rows), **kw)


def timetick(time_tick: int, *, source_id: int = 0, **kw) -> tuple[bytes, dict[str, str]]:
    """A TimeTick for every vchannel (no ``_vc``): version-1 ``msgpb.TimeTickMsg``, ``base.timestamp`` = ``_tt``."""
    body = msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=time_tick,
                                                       sourceID=source_id))
    return body.SerializeToString(), properties(T.TimeTick, time_tick, **kw)


def begin_txn(time_tick: int, vchannel: str, txn_id: int, keepalive_ms: int = DEFAULT_KEEPALIVE_MS,
              **kw) -> tuple[bytes, dict[str, str]]:
    """BeginTxn (version 2): empty body, header keepalive 0 as proxies write it, ``_tx`` with the keepalive."""
    return b"", properties(T.BeginTxn, time_tick, version=2, vchannel=vchannel, header=begin_txn_header(0),
                           txn=txn_context(txn_id, keepalive_ms), **kw)


def commit_txn(time_tick: int, vchannel: str, txn_id: int, keepalive_ms: int = DEFAULT_KEEPALIVE_MS,
               **kw) -> tuple[bytes, dict[str, str]]:
    """CommitTxn (version 2): empty header and body; a reader applies the bodies with this ``_tt``."""
    return b"", properties(T.CommitTxn, time_tick, version=2, vchannel=vchannel,
                           txn=txn_context(txn_id, keepalive_ms), **kw)


def rollback_txn(time_tick: int, vchannel: str, txn_id: int, keepalive_ms: int = DEFAULT_KEEPALIVE_MS,
                 **kw) -> tuple[bytes, dict[str, str]]:
    """RollbackTxn (version 2): a reader drops the transaction's bodies."""
    return b"", properties(T.RollbackTxn, time_tick, version=2, vchannel=vchannel,
                           txn=txn_context(txn_id, keepalive_ms), **kw)


def in_txn(props: dict[str, str], txn_id: int, keepalive_ms: int = DEFAULT_KEEPALIVE_MS) -> dict[str, str]:
    """``props`` of a body message with the transaction's ``_tx`` added."""
    return {**props, TXN: b64(txn_context(txn_id, keepalive_ms))}


__all__ = ["DEFAULT_KEEPALIVE_MS", "b64", "begin_txn", "begin_txn_header", "commit_txn", "delete_header",
           "delete_properties", "in_txn", "insert_header", "insert_properties", "properties", "rollback_txn",
           "timetick", "txn_context"]
