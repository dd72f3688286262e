"""The protobuf wire format at its lowest level: varints and a walk over a message's fields.

A leaf module (no imports from the package) so every layer can read a header or a message id
without parsing whole protobufs: the codec's type peek, the Spark scanner's row counts, Pulsar's
``MessageIdData``, the sink's hand-built ``FieldData``.
"""

from __future__ import annotations

from collections.abc import Iterator


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of an int (negative int64 as two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf: bytes, i: int, end: int | None = None) -> tuple[int, int]:
    """(value, next index) of the protobuf varint at ``buf[i]``, which must end before ``end`` (default: the
    buffer's end)."""
    if end is None:
        end = len(buf)
    b = buf[i] if i < end else -1
    if 0 <= b < 0x80:  # one-byte varints (tags, small lengths) are most of them
        return b, i + 1
    shift = result = 0
    while True:
        if i >= end or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def iter_fields(buf: bytes, i: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, value, start)`` of each protobuf field in ``buf[i:end]``.

    ``value`` is the varint of a wire-0 field and the byte length of a length-delimited one,
    whose bytes begin at ``start``; fixed32/64 fields yield 0. Raises ValueError on an unknown
    wire type or a field running past ``end``.
    """
    end = len(buf) if end is None else end
    while i < end:
        tag, i = read_varint(buf, i)
        wire = tag & 7
        start = i
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            value, start = read_varint(buf, i)
            i = start + value
        elif wire in (1, 5):
            value, i = 0, i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if i > end:
            raise ValueError(f"field {tag >> 3} runs past the end of its message")
        yield tag >> 3, wire, value, start
