"""The properties of a Milvus 2.6 WAL message, decoded into one typed value (wal doc §2).

A message with no ``_v`` (or ``_v`` = ``0``) is a 2.5 msgstream message; ``1`` and ``2`` are
WAL messages. Every reserved key is decoded here; unknown ``_`` keys (newer Milvus) are kept
as they are in ``extra``. A bad value raises DecodeError naming the property and its value.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.errors import DecodeError, UnknownMessageTypeError
from msgstream_spark.msg.wal26.headers import (
    BroadcastHeader,
    CipherHeader,
    ReplicateHeader,
    TxnContext,
    decode_header,
)
from msgstream_spark.msg.wal26.types import b36decode, type_name

VERSION, TYPE, TIME_TICK, BARRIER_TT, WAL_TERM = "_v", "_t", "_tt", "_btt", "_wt"
LAST_CONFIRMED, LAST_CONFIRMED_SELF, VCHANNEL, HEADER = "_lc", "_lcs", "_vc", "_h"
BROADCAST, TXN, CIPHER, REPLICATE, NOT_PERSISTED, PCHANNEL_LEVEL = "_bh", "_tx", "_ch", "_rh", "_np", "_pcl"
RESERVED = frozenset({VERSION, TYPE, TIME_TICK, BARRIER_TT, WAL_TERM, LAST_CONFIRMED, LAST_CONFIRMED_SELF,
                      VCHANNEL, HEADER, BROADCAST, TXN, CIPHER, REPLICATE, NOT_PERSISTED, PCHANNEL_LEVEL})
SUPPORTED_VERSIONS = (1, 2)
CONTROL_VCHANNEL_SUFFIX = "_vcchan"


def wire_version(properties: Mapping[str, str] | None) -> int:
    """0 for a 2.5 message (no ``_v``), else the decimal ``_v`` (DecodeError when not a number)."""
    if not properties:
        return 0
    raw = properties.get(VERSION)
    if raw is None or raw == "":
        return 0
    try:
        value = int(raw, 10)
    except ValueError:
        raise DecodeError(f"property {VERSION}={raw!r} is not a decimal message version") from None
    if value < 0:
        raise DecodeError(f"property {VERSION}={raw!r} is not a valid message version")
    return value


def is_wal_message(properties: Mapping[str, str] | None) -> bool:
    """True for a Milvus 2.6 WAL message (``_v`` >= 1)."""
    return wire_version(properties) > 0


@dataclass(frozen=True)
class Envelope:
    """What the properties of one WAL message say; ``header`` is the raw ``_h`` protobuf."""

    version: int
    msg_type: int
    time_tick: int
    vchannel: str | None = None
    header: bytes = b""
    last_confirmed: str | None = None  # WAL id string (see ids.WalMessageId)
    last_confirmed_self: bool = False  # ``_lcs``: the message's own broker id is its last-confirmed id
    barrier_time_tick: int | None = None
    wal_term: int | None = None
    txn: TxnContext | None = None
    broadcast: BroadcastHeader | None = None
    cipher: CipherHeader | None = None
    replicate: ReplicateHeader | None = None
    not_persisted: bool = False
    pchannel_level: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)  # unknown ``_`` keys, kept as written

    @property
    def type_name(self) -> str:
        return type_name(self.msg_type)

    @property
    def is_control_vchannel(self) -> bool:
        """The cluster's control vchannel (``<pchannel>_vcchan``), which carries cluster-level DDL."""
        return bool(self.vchannel) and self.vchannel.endswith(CONTROL_VCHANNEL_SUFFIX)

    @property
    def all_vchannels(self) -> bool:
        """No ``_vc``: a TimeTick (or pchannel-level message) meant for every vchannel of the pchannel."""
        return not self.vchannel

    @property
    def header_fields(self) -> dict[str, Any] | None:
        """The ``_h`` header decoded by its type's field table (None for types without one)."""
        try:
            return decode_header(self.msg_type, self.header)
        except ValueError as exc:
            raise DecodeError(f"malformed _h header of a {self.type_name} message: {exc}") from None

    @property
    def txn_id(self) -> int | None:
        return None if self.txn is None else self.txn.txn_id

    @property
    def broadcast_id(self) -> int | None:
        return None if self.broadcast is None else self.broadcast.broadcast_id

    @property
    def encrypted(self) -> bool:
        return self.cipher is not None


def _bad(key: str, raw: str, why: str) -> DecodeError:
    shown = raw if len(raw) <= 80 else raw[:80] + "..."
    return DecodeError(f"property {key}={shown!r} {why}")


def _b36(props: Mapping[str, str], key: str, *, signed: bool = False) -> int | None:
    raw = props.get(key)
    if raw is None:
        return None
    try:
        return b36decode(raw, signed=signed)
    except ValueError:
        kind = "int64" if signed else "uint64"
        raise _bad(key, raw, f"is not a base-36 {kind} (Go strconv.Format*(x, 36))") from None


def _b64proto(props: Mapping[str, str], key: str, parse: Callable[[bytes], Any]) -> Any:
    raw = props.get(key)
    if raw is None:
        return None
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(key, raw, "is not standard base64") from None
    try:
        return parse(data)
    except ValueError as exc:
        raise _bad(key, raw, f"is not a valid protobuf: {exc}") from None


def _decimal(props: Mapping[str, str], key: str) -> int:
    raw = props.get(key)
    if raw is None:
        raise DecodeError(f"WAL message without the {key} property")
    try:
        return int(raw, 10)
    except ValueError:
        raise _bad(key, raw, "is not a decimal number") from None


def parse_envelope(properties: Mapping[str, str], *, channel: str | None = None,
                   msg_id: bytes | None = None) -> Envelope:
    """Decode the properties of a WAL message (``_v`` >= 1); DecodeError names what is wrong and where."""
    try:
        return _parse(properties)
    except DecodeError as exc:
        raise exc.with_location(channel, msg_id) from exc.__cause__


def _parse(props: Mapping[str, str]) -> Envelope:
    version = wire_version(props)
    if version == 0:
        raise DecodeError("not a WAL message: no _v property (a Milvus 2.5 msgstream message)")
    if version not in SUPPORTED_VERSIONS:
        raise UnknownMessageTypeError(f"property {VERSION}={props[VERSION]!r}: WAL message version {version} "
                                      f"is newer than this library reads ({', '.join(map(str, SUPPORTED_VERSIONS))})")
    tt = _b36(props, TIME_TICK)
    if tt is None:
        raise DecodeError(f"WAL message without the {TIME_TICK} property (its time tick)")
    header = _b64proto(props, HEADER, bytes)
    return Envelope(
        version=version, msg_type=_decimal(props, TYPE), time_tick=tt, vchannel=props.get(VCHANNEL) or None,
        header=header or b"", last_confirmed=props.get(LAST_CONFIRMED) or None,
        last_confirmed_self=LAST_CONFIRMED_SELF in props, barrier_time_tick=_b36(props, BARRIER_TT),
        wal_term=_b36(props, WAL_TERM, signed=True), txn=_b64proto(props, TXN, TxnContext.parse),
        broadcast=_b64proto(props, BROADCAST, BroadcastHeader.parse),
        cipher=_b64proto(props, CIPHER, CipherHeader.parse),
        replicate=_b64proto(props, REPLICATE, ReplicateHeader.parse), not_persisted=NOT_PERSISTED in props,
        pchannel_level=PCHANNEL_LEVEL in props,
        extra={k: v for k, v in props.items() if k.startswith("_") and k not in RESERVED})
