"""Enums and text encodings of the Milvus 2.6 WAL format (wal doc §2, §4).

``WalMessageType`` is ``messagespb.MessageType`` (the ``_t`` property), not the 2.5
``commonpb.MsgType``; ``WALName`` is ``common.WALName``. Base-36 is Go's
``strconv.FormatUint/FormatInt(x, 36)``: digits ``0-9a-z``, lower case, ``-`` for negatives.
"""

from __future__ import annotations

import enum

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_U64_MAX = (1 << 64) - 1


class WalMessageType(enum.IntEnum):
    """``_t``: messagespb.MessageType of the 2.6 branch (master adds 39-48: pass them through)."""

    Unknown = 0
    TimeTick = 1
    Insert = 2
    Delete = 3
    Flush = 4
    CreateCollection = 5
    DropCollection = 6
    CreatePartition = 7
    DropPartition = 8
    ManualFlush = 9
    CreateSegment = 10
    Import = 11
    SchemaChange = 12  # deprecated, merged into AlterCollection
    AlterCollection = 13
    AlterLoadConfig = 14
    DropLoadConfig = 15
    CreateDatabase = 16
    AlterDatabase = 17
    DropDatabase = 18
    AlterAlias = 19
    DropAlias = 20
    RestoreRBAC = 21
    AlterUser = 22
    DropUser = 23
    AlterRole = 24
    DropRole = 25
    AlterUserRole = 26
    DropUserRole = 27
    AlterPrivilege = 28
    DropPrivilege = 29
    AlterPrivilegeGroup = 30
    DropPrivilegeGroup = 31
    AlterResourceGroup = 32
    DropResourceGroup = 33
    CreateIndex = 34
    AlterIndex = 35
    DropIndex = 36
    FlushAll = 37
    TruncateCollection = 38
    AlterWAL = 700
    AlterReplicateConfig = 800
    BeginTxn = 900
    CommitTxn = 901
    RollbackTxn = 902
    Txn = 999  # assembled by consumers only, never on the broker


def type_name(t: int) -> str:
    """The enum name of a ``_t`` value, or the number for types newer than this table."""
    try:
        return WalMessageType(int(t)).name
    except ValueError:
        return str(int(t))


# Types whose version-1 body is a legacy msgpb request; everything else is a messagespb body.
V1_BODY_TYPES = frozenset({
    WalMessageType.TimeTick, WalMessageType.Insert, WalMessageType.Delete, WalMessageType.CreateCollection,
    WalMessageType.DropCollection, WalMessageType.CreatePartition, WalMessageType.DropPartition,
    WalMessageType.Import,
})
TXN_CONTROL_TYPES = frozenset({WalMessageType.BeginTxn, WalMessageType.CommitTxn, WalMessageType.RollbackTxn})


class WALName(enum.IntEnum):
    """``common.WALName``: which WAL implementation wrote an id."""

    Unknown = 0
    RocksMQ = 1
    Pulsar = 2
    Kafka = 3
    WoodPecker = 4
    Test = 999

    @classmethod
    def parse(cls, value: str | int) -> WALName:
        """From the enum number or its name (case-insensitive)."""
        if isinstance(value, int) or str(value).strip().lstrip("-").isdigit():
            try:
                return cls(int(value))
            except ValueError:
                pass
        else:
            for member in cls:
                if member.name.lower() == str(value).strip().lower():
                    return member
        names = ", ".join(m.name for m in cls)
        raise ValueError(f"unknown WAL name {value!r}; expected one of: {names}")


def b36encode(value: int) -> str:
    """Go's ``FormatInt/FormatUint(value, 36)``: 1000 -> ``rs``, -1 -> ``-1``."""
    value = int(value)
    if value == 0:
        return "0"
    sign, value = ("-", -value) if value < 0 else ("", value)
    out = []
    while value:
        value, r = divmod(value, 36)
        out.append(_DIGITS[r])
    return sign + "".join(reversed(out))


def b36decode(text: str, *, signed: bool = False) -> int:
    """Go's ``ParseUint(text, 36, 64)`` (or ``ParseInt`` with ``signed``); ValueError on bad text."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a base-36 number: {text!r}")
    body = text[1:] if signed and text[0] in "+-" else text
    # ASCII letters and digits only (Go accepts upper case too); int() alone would also take "_", spaces
    if not (body.isascii() and body.isalnum()):
        raise ValueError(f"not a base-36 number: {text!r}")
    value = int(body, 36)
    if signed:
        value = -value if text[0] == "-" else value
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"base-36 number out of int64 range: {text!r}")
    elif value > _U64_MAX:
        raise ValueError(f"base-36 number out of uint64 range: {text!r}")
    return value
