"""WKT -> WKB for Milvus Geometry values, the inverse of msg/wkb.py (pure Python, no GEOS).

Milvus's query answers carry Geometry as WKT (the proxy converts its stored WKB for the client:
``validateGeometryFieldSearchResult``, ``scalars.geometry_wkt_data``), while the log carries the WKB
the proxy made from the client's WKT (``common.ConvertWKTToWKB``: go-geom ``wkb.Marshal`` with NDR
byte order, ISO type codes 1-7 plus 1000 Z / 2000 M / 3000 ZM, no SRID, an empty point as NaN
coordinates). :func:`to_wkb` writes that same form, so a snapshot's Geometry bytes equal the stream's.
"""

from __future__ import annotations

import re
import struct

from msgstream_spark.errors import DecodeError

_CODES = {"POINT": 1, "LINESTRING": 2, "POLYGON": 3, "MULTIPOINT": 4, "MULTILINESTRING": 5, "MULTIPOLYGON": 6,
          "GEOMETRYCOLLECTION": 7}
_TOKEN = re.compile(r"\s*([A-Za-z]+|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|[(),])")
_NAN = float("nan")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items = _TOKEN.findall(text)
        if "".join(self.items) != re.sub(r"\s+", "", text):
            raise DecodeError(f"WKT {text!r} has characters that are not WKT")
        self.pos = 0

    def peek(self) -> str:
        return self.items[self.pos].upper() if self.pos < len(self.items) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise DecodeError(f"WKT {self.text!r}: expected {want or 'more'} at token {self.pos}, "
                              f"got {tok or 'the end'}")
        self.pos += 1
        return tok


def _dims_tag(t: _Tokens) -> str:
    tag = t.peek()
    if tag in ("Z", "M", "ZM"):
        t.take()
        return tag
    return ""


def _coord(t: _Tokens, dims: int) -> list[float]:
    vals = []
    while t.peek() not in (",", ")", ""):
        vals.append(float(t.take()))
    if len(vals) != dims:
        raise DecodeError(f"WKT {t.text!r}: a point has {len(vals)} coordinate(s), expected {dims}")
    return vals


def _seq(t: _Tokens, item) -> list:
    """``( item, item, ... )`` or EMPTY."""
    if t.peek() == "EMPTY":
        t.take()
        return []
    t.take("(")
    out = [item()]
    while t.peek() == ",":
        t.take()
        out.append(item())
    t.take(")")
    return out


def _points(t: _Tokens, dims: int) -> bytes:
    pts = _seq(t, lambda: _coord(t, dims))
    return struct.pack("<I", len(pts)) + b"".join(struct.pack(f"<{dims}d", *p) for p in pts)


_TAGS = {"": 0, "Z": 1000, "M": 2000, "ZM": 3000}


def _geometry(t: _Tokens) -> bytes:
    name = t.take()
    if name not in _CODES:
        raise DecodeError(f"WKT {t.text!r}: {name!r} is not a geometry type")
    return _body(t, _CODES[name], _dims_tag(t))


def _body(t: _Tokens, base: int, tag: str) -> bytes:
    """The WKB of a geometry of type ``base`` whose text (after the name and tag) is at the cursor."""
    dims = 2 + len(tag)
    head = struct.pack("<BI", 1, base + _TAGS[tag])
    if base == 1:
        if t.peek() == "EMPTY":
            t.take()
            return head + struct.pack(f"<{dims}d", *([_NAN] * dims))
        t.take("(")
        body = struct.pack(f"<{dims}d", *_coord(t, dims))
        t.take(")")
        return head + body
    if base == 2:
        return head + _points(t, dims)
    if base == 3:
        rings = _seq(t, lambda: _points(t, dims))
        return head + struct.pack("<I", len(rings)) + b"".join(rings)
    if base == 4:  # members as (x y) or bare x y
        def member() -> bytes:
            if t.peek() == "(":
                t.take()
                xy = _coord(t, dims)
                t.take(")")
            else:
                xy = _coord(t, dims)
            return struct.pack("<BI", 1, 1 + _TAGS[tag]) + struct.pack(f"<{dims}d", *xy)
        parts = _seq(t, member)
    elif base in (5, 6):  # members: bodies of line strings / polygons with the parent's tag
        parts = _seq(t, lambda: _body(t, base - 3, tag))
    else:
        parts = _seq(t, lambda: _geometry(t))
    return head + struct.pack("<I", len(parts)) + b"".join(parts)


def to_wkb(wkt: str | None) -> bytes:
    """ISO WKB (little-endian) of one WKT geometry, as Milvus stores it; None or "" (a null row) gives b""."""
    if not wkt:
        return b""
    t = _Tokens(wkt)
    out = _geometry(t)
    if t.pos != len(t.items):
        raise DecodeError(f"WKT {wkt!r} has text after the geometry")
    return out
