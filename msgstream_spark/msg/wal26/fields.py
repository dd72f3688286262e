"""A small table-driven protobuf reader for Milvus's ``messagespb`` / ``streamingpb`` messages.

pymilvus does not ship those protos (WAL headers, ``TxnContext``, ``BroadcastHeader``,
``WALCheckpoint``), so each message is described as ``{field number: (name, kind)}`` and read
with a field walker. Unknown fields are skipped (newer Milvus adds fields); a field of the wrong
wire type or running past its message raises ValueError.

Every 2.6 insert carries such a header (``_h``), so the walk is on the read path: a table is
compiled once (per table object) into plain tuples and read with an inline varint loop, without
a generator or type checks per field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as PbDecodeError

from msgstream_spark.msg.wire import read_varint

# kind: "int64" | "uint64" | "int32" | "bool" | "enum" | "string" | "bytes" | a nested Spec;
# a kind wrapped in a list means a repeated field (a map is a repeated {1: key, 2: value} entry).
Spec = Mapping[int, tuple[str, Any]]

_VARINT_KINDS = {"int64", "uint64", "int32", "bool", "enum"}
_U64 = 1 << 64
_I64_MIN = 1 << 63

# compiled kinds
_K_U64, _K_I64, _K_I32, _K_BOOL, _K_STR, _K_BYTES, _K_MSG = range(7)
_CODES = {"uint64": _K_U64, "int64": _K_I64, "int32": _K_I32, "enum": _K_I32, "bool": _K_BOOL,
          "string": _K_STR, "bytes": _K_BYTES}


class _Compiled:
    """A table as (field number -> (name, code, repeated, nested)) plus its proto3 defaults."""

    __slots__ = ("spec", "fields", "defaults", "repeated")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec  # held: the cache is keyed by the table's identity
        self.fields: dict[int, tuple[str, int, bool, _Compiled | None]] = {}
        self.defaults: dict[str, Any] = {}
        self.repeated: tuple[str, ...] = ()
        reps = []
        for number, (name, kind) in spec.items():
            rep = isinstance(kind, list)
            inner = kind[0] if rep else kind
            if isinstance(inner, Mapping):
                code, nested, default = _K_MSG, _compile(inner), None
            elif inner in _CODES:
                code, nested = _CODES[inner], None
                default = "" if code == _K_STR else b"" if code == _K_BYTES else False if code == _K_BOOL else 0
            else:
                raise ValueError(f"field {name!r}: unknown kind {inner!r}")
            self.fields[number] = (name, code, rep, nested)
            if rep:
                reps.append(name)
            else:
                self.defaults[name] = default
        self.repeated = tuple(reps)


_CACHE: dict[int, _Compiled] = {}


def _compile(spec: Spec) -> _Compiled:
    c = _CACHE.get(id(spec))
    if c is None or c.spec is not spec:
        if len(_CACHE) >= 256:  # tables built per call (a literal in a function) must not pile up
            _CACHE.clear()
        c = _CACHE[id(spec)] = _Compiled(spec)
    return c


def _scalar(code: int, value: int) -> int | bool:
    if code == _K_U64:
        return value
    if code == _K_BOOL:
        return bool(value)
    if code == _K_I32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - _U64 if value >= _I64_MIN else value  # int64


def _packed(code: int, buf: bytes, start: int, end: int) -> list[int]:
    out, i = [], start
    while i < end:
        v, i = read_varint(buf, i, end)
        out.append(_scalar(code, v))
    return out


def _value(c_name: str, code: int, nested: _Compiled | None, wire: int, value: int, start: int, buf: bytes) -> Any:
    if code == _K_MSG:
        if wire != 2:
            raise ValueError(f"field {c_name!r}: expected a message, got wire type {wire}")
        return _decode(nested, buf, start, start + value)
    if code <= _K_BOOL:
        if wire != 0:
            raise ValueError(f"field {c_name!r}: expected a varint, got wire type {wire}")
        return _scalar(code, value)
    if wire != 2:
        raise ValueError(f"field {c_name!r}: expected length-delimited bytes, got wire type {wire}")
    raw = bytes(buf[start:start + value])
    if code == _K_STR:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"field {c_name!r} is not UTF-8") from exc
    return raw


def _decode(c: _Compiled, buf: bytes, i: int, end: int) -> dict[str, Any]:
    out = dict(c.defaults)
    for name in c.repeated:
        out[name] = []
    table = c.fields
    while i < end:
        tag, i = read_varint(buf, i, end)
        wire = tag & 7
        start = i
        if wire == 0:
            value, i = read_varint(buf, i, end)
        elif wire == 2:
            value, start = read_varint(buf, i, end)
            i = start + value
        elif wire == 1 or wire == 5:
            value, i = 0, i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if i > end:
            raise ValueError(f"field {tag >> 3} runs past the end of its message")
        entry = table.get(tag >> 3)
        if entry is None:
            continue
        name, code, rep, nested = entry
        if not rep:
            out[name] = _value(name, code, nested, wire, value, start, buf)
        elif wire == 2 and code <= _K_BOOL:
            out[name].extend(_packed(code, buf, start, i))
        else:
            out[name].append(_value(name, code, nested, wire, value, start, buf))
    return out


def decode(spec: Spec, buf: bytes) -> dict[str, Any]:
    """Read ``buf`` as the message described by ``spec``; absent fields get proto3 defaults."""
    return _decode(_compile(spec), buf, 0, len(buf))


# -- a compiled protobuf class for a hot table ------------------------------------------------------
_PB_KINDS = {"int64": 3, "uint64": 4, "int32": 5, "enum": 5, "bool": 8, "string": 9, "bytes": 12}  # TYPE_*
_pool = None
_classes: dict[int, tuple[Spec, Any]] = {}


def _describe(spec: Spec, name: str, file: Any, prefix: str) -> None:
    """Add ``spec`` as message ``name`` (and its nested tables) to a FileDescriptorProto."""
    msg = file.message_type.add(name=name)
    for number, (fname, kind) in sorted(spec.items()):
        rep = isinstance(kind, list)
        inner = kind[0] if rep else kind
        f = msg.field.add(name=fname, number=number, label=3 if rep else 1)
        if isinstance(inner, Mapping):
            sub = f"{name}_{fname}"
            _describe(inner, sub, file, prefix)
            f.type, f.type_name = 11, f".{prefix}.{sub}"  # TYPE_MESSAGE
        else:
            f.type = _PB_KINDS[inner]


def proto_class(spec: Spec, name: str) -> Any:
    """A generated protobuf class reading the same bytes as ``spec`` (built once per table).

    The C parser (upb) reads a small header several times faster than the field walker; the
    walker stays the reference (see :func:`parse_fast`).
    """
    global _pool
    hit = _classes.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    if _pool is None:
        _pool = descriptor_pool.DescriptorPool()
    prefix = f"msgstream_wal26_{len(_classes)}"
    file = descriptor_pb2.FileDescriptorProto(name=f"{prefix}.proto", package=prefix, syntax="proto3")
    _describe(spec, name, file, prefix)
    _pool.Add(file)
    cls = message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{prefix}.{name}"))
    _classes[id(spec)] = (spec, cls)
    return cls


def parse_fast(spec: Spec, cls: Any, buf: bytes) -> Any:
    """``buf`` parsed by ``proto_class(spec)``, with the field walker's rules.

    The protobuf parser keeps a known field of the wrong wire type as an unknown field where the
    walker raises, and rejects bad UTF-8 with its own error: any message it refuses, or whose known
    fields do not account for every byte (unknown fields, or an encoding other than the canonical one
    Milvus's serializer writes), is read again by :func:`decode` (which raises ValueError naming the
    field, or accepts it), so the result and the errors are the walker's.
    """
    try:
        m = cls.FromString(buf)
    except (PbDecodeError, RuntimeError, ValueError):
        decode(spec, buf)  # raises the walker's error
        raise ValueError("not a valid protobuf message") from None
    m.DiscardUnknownFields()
    if m.ByteSize() != len(buf):  # unknown fields (a newer Milvus's, or a wrong wire type: an error), or
        decode(spec, buf)  # a non-canonical encoding: the walker decides
    return m
