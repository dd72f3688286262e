"""An Insert's float vectors read in place: numpy views of the payload instead of protobuf's copies.

Parsing an ``InsertRequest`` copies its float-vector data into protobuf's memory, and turning the
repeated field into numpy copies it again: two fresh buffers the size of the message (1000 rows of
128-d vectors: 0.5 MB) per message, the bulk of what a read of such a log allocates. The data is one
packed run of little-endian floats inside the payload, so a read can view it where it lies.

:func:`split_float_vectors` walks the payload's fields (a few dozen varints: tags and lengths, the
data itself is not touched) and finds each top-level ``FieldData``'s ``vectors.float_vector.data``.
It returns the payload with that data left out (an empty ``float_vector``, so the oneof still says
which vector kind it is), for protobuf to parse (~40 KB instead of 0.5 MB here), and the data's
place in the payload per ``fields_data`` index. The caller views it with ``numpy.frombuffer`` (the
array keeps the payload alive). Anything unusual (a field split over several runs, a length not a
multiple of 4, a group) returns None: the caller parses the whole payload as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from msgstream_spark.msg.wire import encode_varint, read_varint

_FIELDS_DATA = 13  # InsertRequest.fields_data
_VECTORS = 4  # FieldData.vectors
_FLOAT_VECTOR = 2  # VectorField.float_vector
_DATA = 1  # FloatArray.data (packed)
_EMPTY_FLOAT_VECTOR = bytes([(_FLOAT_VECTOR << 3) | 2, 0])  # float_vector present, no values


def _fields(buf: Any, i: int, end: int):
    """(field number, wire type, tag start, value start, value end) of each field in ``buf[i:end]``; raises ValueError
    on groups and on a field running past ``end``."""
    while i < end:
        at = i
        tag, i = read_varint(buf, i, end)
        wire = tag & 7
        if wire == 0:
            start = i
            _, i = read_varint(buf, i, end)
        elif wire == 2:
            n, start = read_varint(buf, i, end)
            i = start + n
        elif wire in (1, 5):
            start = i
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if i > end:
            raise ValueError("field past its message's end")
        yield tag >> 3, wire, at, start, i


def _only(buf: Any, i: int, end: int, number: int) -> tuple[int, int, int] | None:
    """(tag start, value start, value end) of field ``number`` in ``buf[i:end]`` when it occurs once, length-delimited;
    None when absent, repeated or of another wire type."""
    found = None
    for num, wire, at, start, stop in _fields(buf, i, end):
        if num == number:
            if found is not None or wire != 2:
                return None
            found = (at, start, stop)
    return found


def _float_data(buf: Any, start: int, end: int) -> tuple[tuple[int, int, int], int, int] | None:
    """In the FieldData ``buf[start:end]``: (its vectors field's span, the float_vector field's tag start and end in
    the payload) and the data's offset and byte length, or None."""
    vec = _only(buf, start, end, _VECTORS)
    if vec is None:
        return None
    fv = _only(buf, vec[1], vec[2], _FLOAT_VECTOR)
    if fv is None:
        return None
    data = _only(buf, fv[1], fv[2], _DATA)
    if data is None or (data[2] - data[1]) % 4 or data[0] != fv[1] or data[2] != fv[2]:
        return None
    return (vec, fv[0], fv[2]), data[1], data[2] - data[1]


def _entry_without(buf: Any, start: int, end: int, vec: tuple[int, int, int], fv_at: int, fv_end: int) -> bytes:
    """The FieldData ``buf[start:end]`` with its float_vector emptied (the lengths around it re-encoded)."""
    vf = b"".join((buf[vec[1]:fv_at], _EMPTY_FLOAT_VECTOR, buf[fv_end:vec[2]]))
    return b"".join((buf[start:vec[0]], encode_varint((_VECTORS << 3) | 2), encode_varint(len(vf)), vf,
                     buf[vec[2]:end]))


def split_float_vectors(payload: bytes) -> tuple[bytes, dict[int, tuple[int, int]]] | None:
    """(the payload without its top-level float-vector data, {``fields_data`` index: (offset, byte length) of that
    field's floats in ``payload``}) of a serialized ``InsertRequest``; None when it has no such data or is not laid
    out as one packed run per field (the caller then parses the whole payload)."""
    buf = memoryview(payload)
    end = len(buf)
    out: list[Any] = []
    spans: dict[int, tuple[int, int]] = {}
    last = k = 0
    try:
        for num, wire, at, start, stop in _fields(buf, 0, end):
            if num != _FIELDS_DATA or wire != 2:
                continue
            got = _float_data(buf, start, stop)
            if got is not None:
                (vec, fv_at, fv_end), off, nbytes = got
                entry = _entry_without(buf, start, stop, vec, fv_at, fv_end)
                out += [buf[last:at], encode_varint((_FIELDS_DATA << 3) | 2), encode_varint(len(entry)), entry]
                last = stop
                spans[k] = (off, nbytes)
            k += 1
    except ValueError:
        return None  # malformed: the full parse reports it
    if not spans:
        return None
    out.append(buf[last:end])
    return b"".join(out), spans


def float_views(payload: bytes, spans: dict[int, tuple[int, int]]) -> dict[int, np.ndarray]:
    """The float32 views of ``payload`` at :func:`split_float_vectors`'s ``spans`` (no copy), each on a 4-byte
    boundary: data that the payload's varints put elsewhere is copied (:func:`_aligned`)."""
    return {k: _aligned(np.frombuffer(payload, dtype="<f4", count=n // 4, offset=off)) for k, (off, n) in spans.items()}


def _aligned(view: np.ndarray) -> np.ndarray:
    """``view`` where its floats start on a 4-byte boundary, else a copy. Where the data lies in the payload depends
    on the lengths before it (names, ids, timestamps' varints): any byte. Arrow's Rust readers of a column over the
    C data interface (Lance's writer) refuse a float buffer off its type's alignment, and NumPy and Arrow kernels
    run slower on one."""
    return view if view.ctypes.data % view.dtype.alignment == 0 else view.copy()
