"""msg.wkb.to_wkt against an independent converter (shapely / GEOS): every OGC type, Z / M / ZM, empties."""

from __future__ import annotations

import pytest
import shapely

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.wkb import to_wkt
from tests.types26 import data as D

WKT = [
    "POINT (1 2)", "POINT (-0.5 1e-07)", "POINT Z (1 2 3)", "POINT M (1 2 4)", "POINT ZM (1 2 3 4)", "POINT EMPTY",
    "LINESTRING (0 0, 1 1, 2 3.25)", "LINESTRING Z (0 0 1, 1 1 2)", "LINESTRING EMPTY",
    "POLYGON ((0 0, 4 0, 4 4, 0 4, 0 0), (1 1, 2 1, 2 2, 1 1))", "POLYGON EMPTY",
    "MULTIPOINT ((1 2), (3 4))", "MULTIPOINT Z ((1 2 3), (4 5 6))",
    "MULTILINESTRING ((0 0, 1 1), (2 2, 3 3, 4 5))",
    "MULTIPOLYGON (((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5), (5.2 5.1, 5.8 5.1, 5.8 5.5, 5.2 5.1)))",
    "GEOMETRYCOLLECTION (POINT (1 2), LINESTRING (0 0, 1 1), POLYGON ((0 0, 1 0, 1 1, 0 0)))",
    "GEOMETRYCOLLECTION EMPTY",
    "POINT (123456789.123456 -0.000123)", "POINT (1e+20 -2.5e-300)",
]


def _iso_wkb(g) -> bytes:
    dims = 4 if shapely.has_z(g) and shapely.has_m(g) else 3 if shapely.has_z(g) or shapely.has_m(g) else 2
    return shapely.to_wkb(g, byte_order=1, flavor="iso", include_srid=False, output_dimension=dims)


@pytest.mark.parametrize("wkt", WKT)
def test_wkt_of_iso_wkb_equals_geos(wkt):
    g = shapely.from_wkt(wkt)
    mine = to_wkt(_iso_wkb(g))
    back = shapely.from_wkt(mine)
    assert back.geom_type == g.geom_type and shapely.has_z(back) == shapely.has_z(g)
    assert shapely.has_m(back) == shapely.has_m(g)
    assert shapely.equals_exact(back, g, tolerance=0) or (g.is_empty and back.is_empty)
    assert mine == shapely.to_wkt(g, rounding_precision=-1, trim=True)  # the same text as GEOS writes


def test_big_endian_and_ewkb_read_too():
    g = shapely.from_wkt("POINT Z (1 2 3)")
    big = shapely.to_wkb(g, byte_order=0, flavor="iso", output_dimension=3)
    assert to_wkt(big) == "POINT Z (1 2 3)"
    ewkb = shapely.to_wkb(shapely.set_srid(g, 4326), byte_order=1, flavor="extended", include_srid=True,
                          output_dimension=3)
    assert to_wkt(ewkb) == "POINT Z (1 2 3)"


def test_the_proxys_bytes_and_nulls():
    assert to_wkt(D.wkt_to_wkb("POINT (1 2)")) == "POINT (1 2)"
    assert to_wkt(b"") is None and to_wkt(None) is None  # a null Geometry row holds empty bytes


@pytest.mark.parametrize("bad, what", [(b"\x02\x01\x00\x00\x00", "byte order"), (b"\x01\x09\x00\x00\x00", "type 9"),
                                       (b"\x01\x01\x00\x00\x00\x00", "ends at byte"),
                                       (D.wkt_to_wkb("POINT (1 2)") + b"\x00", "after the geometry")])
def test_bad_wkb_is_a_clear_error(bad, what):
    with pytest.raises(DecodeError, match=what):
        to_wkt(bad)
