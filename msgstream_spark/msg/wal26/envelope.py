"""The properties of a Milvus 2.6 WAL message, decoded into one typed value (wal doc §2).

A message with no ``_v`` (or ``_v`` = ``0``) is a 2.5 msgstream message; ``1`` and ``2`` are
WAL messages. Every reserved key is decoded here; unknown ``_`` keys (newer Milvus) are kept
as they are in ``extra``. A bad value raises DecodeError naming the property and its value.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
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
    """Whether the properties are a 2.6 envelope (``_v`` >= 1): the one test every reader branches on.

    ``False`` for a 2.5 message: no ``_v``, or ``_v`` = ``0`` (Milvus's VersionOld: how a 2.6 proxy's
    ``DumpMessages`` serves entries written before the upgrade, with rebuilt ``_t``/``_tt``/``_vc``/``_h``/
    ``_lc`` around a 2.5 body; ``_t`` there is no envelope). A malformed ``_v`` counts as an envelope, so
    that decoding it reports what is wrong. Never raises.
    """
    if not properties:
        return False
    raw = properties.get(VERSION)
    if raw == "1" or raw == "2":  # the common cases first
        return True
    if not raw:
        return False
    try:
        return int(raw, 10) != 0
    except ValueError:
        return True


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

    @classmethod
    def _of(cls, fields: dict[str, Any]) -> Envelope:
        """An Envelope of ``fields`` (``extra`` included; the others may be left at their defaults).

        The generated frozen ``__init__`` sets all 16 fields one by one through ``object.__setattr__``
        (about 2 us); the reader builds one per message, so this fills the instance dict at once.
        """
        env = object.__new__(cls)
        env.__dict__.update(fields)
        return env

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
        data = _unb64(raw)
    except (binascii.Error, ValueError):
        raise _bad(key, raw, "is not standard base64") from None
    try:
        return parse(data)
    except ValueError as exc:
        raise _bad(key, raw, f"is not a valid protobuf: {exc}") from None


_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def _unb64(raw: str) -> bytes:
    """``base64.b64decode(raw, validate=True)`` for a property value, without its per-call plumbing."""
    if not isinstance(raw, str) or not raw.isascii() or _B64.fullmatch(raw) is None:
        raise ValueError("not standard base64")
    return binascii.a2b_base64(raw)


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
    get = props.get
    v = get(VERSION)
    version = 1 if v == "1" else 2 if v == "2" else wire_version(props)  # the common cases first
    if version == 0:
        raise DecodeError("not a WAL message: no _v property (a Milvus 2.5 msgstream message)")
    if version not in SUPPORTED_VERSIONS:
        raise UnknownMessageTypeError(f"property {VERSION}={props[VERSION]!r}: WAL message version {version} "
                                      f"is newer than this library reads ({', '.join(map(str, SUPPORTED_VERSIONS))})")
    tt = _b36(props, TIME_TICK)
    if tt is None:
        raise DecodeError(f"WAL message without the {TIME_TICK} property (its time tick)")
    h = get(HEADER)
    fields = {"version": version, "msg_type": _decimal(props, TYPE), "time_tick": tt,
              "vchannel": get(VCHANNEL) or None, "header": _b64proto(props, HEADER, bytes) if h else b"",
              "last_confirmed": get(LAST_CONFIRMED) or None, "last_confirmed_self": LAST_CONFIRMED_SELF in props,
              "not_persisted": NOT_PERSISTED in props, "pchannel_level": PCHANNEL_LEVEL in props, "extra": _NO_EXTRA}
    if not props.keys() <= _USUAL:  # the rarer keys: looked at only when present
        _rare(props, fields)
    return Envelope._of(fields)


_USUAL = frozenset({VERSION, TYPE, TIME_TICK, HEADER, VCHANNEL, LAST_CONFIRMED, LAST_CONFIRMED_SELF,
                    NOT_PERSISTED, PCHANNEL_LEVEL})
_NO_EXTRA: Mapping[str, str] = MappingProxyType({})


def _rare(props: Mapping[str, str], fields: dict[str, Any]) -> None:
    """The optional keys (barrier, term, transaction, broadcast, cipher, replicate) and unknown ``_`` keys."""
    if BARRIER_TT in props:
        fields["barrier_time_tick"] = _b36(props, BARRIER_TT)
    if WAL_TERM in props:
        fields["wal_term"] = _b36(props, WAL_TERM, signed=True)
    for key, name, parse in _PROTO_KEYS:
        if key in props:
            fields[name] = _b64proto(props, key, parse)
    if not props.keys() <= RESERVED:
        fields["extra"] = {k: v for k, v in props.items() if k.startswith("_") and k not in RESERVED}


_PROTO_KEYS = ((TXN, "txn", TxnContext.parse), (BROADCAST, "broadcast", BroadcastHeader.parse),
               (CIPHER, "cipher", CipherHeader.parse), (REPLICATE, "replicate", ReplicateHeader.parse))
