"""Byte-level fast paths of the sink's encoder (protobuf wire format, no per-value Python).

A protobuf message is the concatenation of its encoded fields, so an InsertRequest can be
assembled from separately serialized parts in field-number order: the header (fields
1-11), one ``fields_data`` entry (13) per column and the tail (14-15). The result is
byte-identical to serializing the whole message. A FloatVector column is encoded here
straight from its float32 buffer (packed repeated float = the raw little-endian bytes),
which avoids building a Python float per value; other columns go through
:func:`msgstream_spark.msg.columns.arrow_to_field_data`. Tests compare both paths.
"""

from __future__ import annotations

import numpy as np

from msgstream_spark.msg.wire import encode_varint as varint

FLOAT_VECTOR = 101
_LEN = 2  # wire type of length-delimited fields
_VARINT = 0


def tag(field_number: int, wire_type: int) -> bytes:
    return varint((field_number << 3) | wire_type)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    return tag(field_number, _LEN) + varint(len(payload)) + payload


def float_vector_entry(rows: np.ndarray, name: str, field_id: int) -> list:
    """One ``fields_data`` (13) entry for a (n, dim) float32 array, as buffer parts to join.

    No intermediate copies: the parts are small headers plus a view of ``rows``; the
    caller joins the whole message once.
    """
    n, dim = rows.shape
    raw = memoryview(np.ascontiguousarray(rows, dtype="<f4")).cast("B")
    nbytes = n * dim * 4
    fa_head = (tag(1, _LEN) + varint(nbytes)) if nbytes else b""
    fa_len = len(fa_head) + nbytes
    vf_head = tag(1, _VARINT) + varint(dim) + tag(2, _LEN) + varint(fa_len)
    vf_len = len(vf_head) + fa_len
    fd_head = tag(1, _VARINT) + varint(FLOAT_VECTOR)
    if name:
        fd_head += length_delimited(2, name.encode())
    fd_head += tag(4, _LEN) + varint(vf_len)
    fd_tail = (tag(5, _VARINT) + varint(field_id)) if field_id else b""
    fd_len = len(fd_head) + vf_len + len(fd_tail)
    return [tag(13, _LEN) + varint(fd_len) + fd_head + vf_head + fa_head, raw, fd_tail]


def fields_data_entry(field_data_bytes: bytes) -> bytes:
    """One ``InsertRequest.fields_data`` (field 13) entry."""
    return length_delimited(13, field_data_bytes)
