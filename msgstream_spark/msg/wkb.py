"""WKB -> WKT for Milvus Geometry values (pure Python, no GEOS).

Milvus stores a Geometry as ISO WKB (``common.ConvertWKTToWKB``: little-endian, type codes 1-7
plus 1000 Z / 2000 M / 3000 ZM, no SRID; an empty point as NaN coordinates). The reader yields
those bytes; :func:`to_wkt` turns one into OGC WKT, e.g. as a Spark UDF::

    from pyspark.sql import functions as F
    from msgstream_spark.msg.wkb import to_wkt
    df.withColumn("shape_wkt", F.udf(to_wkt, "string")("shape"))

Big-endian input and EWKB flags (0x80000000 Z, 0x40000000 M, 0x20000000 SRID, skipped) read too.
"""

from __future__ import annotations

import math
import struct

from msgstream_spark.errors import DecodeError

_NAMES = {1: "POINT", 2: "LINESTRING", 3: "POLYGON", 4: "MULTIPOINT", 5: "MULTILINESTRING", 6: "MULTIPOLYGON",
          7: "GEOMETRYCOLLECTION"}
_EWKB_Z, _EWKB_M, _EWKB_SRID = 0x80000000, 0x40000000, 0x20000000


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.order = data, 0, "<"

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise DecodeError(f"WKB ends at byte {len(self.data)}, inside a value at byte {self.pos}")
        out = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += size
        return out


def _num(x: float) -> str:
    """The shortest text that reads back as ``x``, as GEOS writes it (``1``, ``0.5``, ``1e-7``)."""
    text = repr(float(x))
    if "e" in text:
        mant, exp = text.split("e")
        return f"{mant[:-2] if mant.endswith('.0') else mant}e{exp[0]}{exp[1:].lstrip('0') or '0'}"
    return text[:-2] if text.endswith(".0") else text


def _coords(r: _Reader, dims: int, n: int) -> list[str]:
    return [" ".join(_num(v) for v in r.take(f"{dims}d")) for _ in range(n)]


def _geometry(r: _Reader) -> tuple[str, str, str]:
    """(type name, dimension tag, ``(...)`` or ``EMPTY``) of the geometry at the cursor."""
    (order,) = struct.unpack_from("B", r.data, r.pos) if r.pos < len(r.data) else (None,)
    if order not in (0, 1):
        raise DecodeError(f"WKB byte order {order!r} at byte {r.pos} is neither 0 nor 1")
    r.pos += 1
    r.order = "<" if order == 1 else ">"
    (code,) = r.take("I")
    has_z, has_m = bool(code & _EWKB_Z), bool(code & _EWKB_M)
    if code & _EWKB_SRID:
        r.take("I")
    code &= 0x0FFFFFFF
    base, iso = code % 1000, code // 1000
    if base not in _NAMES or iso > 3:
        raise DecodeError(f"WKB geometry type {code} at byte {r.pos - 4} is not an OGC type")
    has_z, has_m = has_z or iso in (1, 3), has_m or iso in (2, 3)
    tag = ("Z" if has_z else "") + ("M" if has_m else "")
    return _NAMES[base], tag, _body(r, base, 2 + has_z + has_m)


def _text(name: str, tag: str, inner: str) -> str:
    return f"{name} {tag} {inner}" if tag else f"{name} {inner}"


def _body(r: _Reader, base: int, dims: int) -> str:
    if base == 1:
        xy = r.take(f"{dims}d")
        return "EMPTY" if all(math.isnan(v) for v in xy) else "(" + " ".join(_num(v) for v in xy) + ")"
    (n,) = r.take("I")
    if n == 0:
        return "EMPTY"
    if base == 2:
        parts = _coords(r, dims, n)
    elif base == 3:
        parts = []
        for _ in range(n):
            (k,) = r.take("I")
            parts.append("(" + ", ".join(_coords(r, dims, k)) + ")")
    elif base == 7:  # a collection's members keep their type names
        parts = [_text(*_geometry(r)) for _ in range(n)]
    else:  # Multi*: the members' bodies only
        parts = [_geometry(r)[2] for _ in range(n)]
    return "(" + ", ".join(parts) + ")"


def to_wkt(wkb: bytes | bytearray | memoryview | None) -> str | None:
    """OGC WKT of one WKB geometry (``None`` and empty bytes, a null Geometry row, give ``None``)."""
    if wkb is None or len(wkb) == 0:
        return None
    r = _Reader(bytes(wkb))
    text = _text(*_geometry(r))
    if r.pos != len(r.data):
        raise DecodeError(f"WKB has {len(r.data) - r.pos} byte(s) after the geometry")
    return text
