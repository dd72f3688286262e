"""A small table-driven protobuf reader for Milvus's ``messagespb`` / ``streamingpb`` messages.

pymilvus does not ship those protos (WAL headers, ``TxnContext``, ``BroadcastHeader``,
``WALCheckpoint``), so each message is described as ``{field number: (name, kind)}`` and read
with the codec's field walker. Unknown fields are skipped (newer Milvus adds fields); a field of
the wrong wire type or running past its message raises ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgstream_spark.msg.codec import iter_fields, read_varint

# kind: "int64" | "uint64" | "int32" | "bool" | "enum" | "string" | "bytes" | a nested Spec;
# a kind wrapped in a list means a repeated field (a map is a repeated {1: key, 2: value} entry).
Spec = Mapping[int, tuple[str, Any]]

_VARINT_KINDS = {"int64", "uint64", "int32", "bool", "enum"}
_U64 = 1 << 64


def _scalar(kind: str, value: int) -> int | bool:
    if kind == "uint64":
        return value
    if kind == "bool":
        return bool(value)
    if kind == "int32" or kind == "enum":
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - _U64 if value >= 1 << 63 else value  # int64


def _empty(spec: Spec) -> dict[str, Any]:
    return {name: ([] if isinstance(kind, list) else _default(kind)) for name, kind in spec.values()}


def _default(kind: Any) -> Any:
    if isinstance(kind, Mapping):
        return None
    if kind == "string":
        return ""
    if kind == "bytes":
        return b""
    if kind == "bool":
        return False
    return 0


def _packed(kind: str, buf: bytes, start: int, length: int) -> list[int]:
    out, i, end = [], start, start + length
    while i < end:
        v, i = read_varint(buf, i)
        out.append(_scalar(kind, v))
    if i != end:
        raise ValueError("packed field runs past its length")
    return out


def _read_one(kind: Any, name: str, wire: int, value: int, start: int, buf: bytes) -> Any:
    if isinstance(kind, Mapping):
        if wire != 2:
            raise ValueError(f"field {name!r}: expected a message, got wire type {wire}")
        return decode(kind, buf[start:start + value])
    if isinstance(kind, str) and kind in _VARINT_KINDS:
        if wire != 0:
            raise ValueError(f"field {name!r}: expected a varint, got wire type {wire}")
        return _scalar(kind, value)
    if wire != 2:
        raise ValueError(f"field {name!r}: expected length-delimited bytes, got wire type {wire}")
    raw = bytes(buf[start:start + value])
    if kind == "string":
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"field {name!r} is not UTF-8") from exc
    return raw


def decode(spec: Spec, buf: bytes) -> dict[str, Any]:
    """Read ``buf`` as the message described by ``spec``; absent fields get proto3 defaults."""
    out = _empty(spec)
    for number, wire, value, start in iter_fields(buf):
        entry = spec.get(number)
        if entry is None:
            continue
        name, kind = entry
        if isinstance(kind, list):
            inner = kind[0]
            if wire == 2 and isinstance(inner, str) and inner in _VARINT_KINDS:
                out[name].extend(_packed(inner, buf, start, value))
            else:
                out[name].append(_read_one(inner, name, wire, value, start, buf))
        else:
            out[name] = _read_one(kind, name, wire, value, start, buf)
    return out

