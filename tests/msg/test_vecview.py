"""Float vectors read in place (msg/vecview.py): a read's inserts keep their float vectors as views of the payload,
not protobuf's copies, with the same rows; anything laid out otherwise is parsed whole as before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.local.message_id import LocalMessageID
from msgstream_spark.mq.message import Message
from msgstream_spark.msg import codec, vecview
from msgstream_spark.msg.wal26 import decode_message
from msgstream_spark.msg.wire import encode_varint
from msgstream_spark.stream.decode import ChannelDecoder
from tests.chaos.badinput import DIM, insert_msg
from tests.wal26 import producer as P


def _inside(arr: np.ndarray, payload: bytes) -> bool:
    return np.shares_memory(arr, np.frombuffer(payload, np.uint8))


def _viewed(arr: np.ndarray, payload: bytes) -> bool:
    """A view of the payload where the floats lie on a 4-byte boundary there, else an aligned copy."""
    return _inside(arr, payload) if arr.base is not None else arr.ctypes.data % 4 == 0


def test_a_read_decoder_views_the_float_vectors_in_the_payload_and_gives_the_same_rows():
    payload, props = codec.marshal(insert_msg(0, 50, ts=1 << 40, msg_id=1))
    whole = codec.unmarshal(payload, props)
    m = Message("ch", payload, props, LocalMessageID(7), None)
    [got] = ChannelDecoder("ch", "local", float_views=True).feed(m)
    arrays = got.msg.field_arrays()
    assert arrays == whole.field_arrays()  # pk, vec and name, value for value
    values = arrays["vec"].values
    assert values.to_numpy()[:DIM].tolist() == list(range(DIM))  # pk 0's vector: 0, 1, ..., DIM - 1
    view = np.frombuffer(values.buffers()[1], np.float32)
    assert _inside(view, payload)  # the Arrow column reads the payload's bytes: no copy was made
    assert len(got.msg.proto.fields_data[1].vectors.float_vector.data) == 0  # protobuf did not get them
    assert got.msg.proto.fields_data[1].vectors.WhichOneof("data") == "float_vector"
    [plain] = ChannelDecoder("ch", "local").feed(m)  # other readers (the mirror) still get the whole protobuf
    assert plain.msg.float_views is None and len(plain.msg.proto.fields_data[1].vectors.float_vector.data) == 50 * DIM


def test_a_nullable_vector_in_compact_form_keeps_its_nulls():
    msg = insert_msg(0, 4, ts=1 << 40, msg_id=1)
    fd = msg.proto.fields_data[1]
    fd.valid_data.extend([True, False, True, False])
    del fd.vectors.float_vector.data[2 * DIM:]  # compact: the valid rows' values only
    payload, props = codec.marshal(msg)
    got = codec.unmarshal(payload, props, float_views=True)
    assert got.float_views is not None and _viewed(got.float_views[1], payload)
    vec = got.field_arrays()["vec"]
    assert vec.null_count == 2 and vec == codec.unmarshal(payload, props).field_arrays()["vec"]


def test_float_data_in_two_packed_runs_is_parsed_whole():
    """Protobuf allows a packed field in several runs (a merged message): not one view, so the whole parse."""
    msg = insert_msg(0, 4, ts=1 << 40, msg_id=1)
    head, _ = codec.marshal(msg)
    fd = msg.proto.fields_data[1]
    values = np.asarray(fd.vectors.float_vector.data, np.float32)
    a, b = values[:DIM].tobytes(), values[DIM:].tobytes()
    float_array = b"".join([b"\x0a", encode_varint(len(a)), a, b"\x0a", encode_varint(len(b)), b])
    fd.vectors.ClearField("float_vector")
    vf = fd.vectors.SerializeToString() + b"\x12" + encode_varint(len(float_array)) + float_array
    fd.ClearField("vectors")
    entry = fd.SerializeToString() + b"\x22" + encode_varint(len(vf)) + vf
    del msg.proto.fields_data[1]
    payload = msg.proto.SerializeToString() + b"\x6a" + encode_varint(len(entry)) + entry
    assert vecview.split_float_vectors(payload) is None
    got = codec.unmarshal(payload, {"msg_type": "Insert"}, float_views=True)
    assert got.float_views is None
    assert got.field_arrays()["vec"] == codec.unmarshal(head, {"msg_type": "Insert"}).field_arrays()["vec"]


def test_malformed_vectors_fail_as_before():
    msg = insert_msg(0, 5, ts=1 << 40, msg_id=1)
    msg.proto.fields_data[1].vectors.float_vector.data.extend([0.5, 0.5])  # 5 rows and a half
    payload, props = codec.marshal(msg)
    with pytest.raises(DecodeError, match="'vec'.*does not hold a whole number of rows"):
        codec.unmarshal(payload, props, float_views=True)
    good, _ = codec.marshal(insert_msg(0, 5, ts=1 << 40, msg_id=1))
    for cut in (len(good) - 3, len(good) // 2):
        with pytest.raises(DecodeError, match="malformed Insert payload"):
            codec.unmarshal(good[:cut], props, float_views=True)


def test_a_message_without_float_vectors_is_parsed_whole():
    msg = insert_msg(0, 3, ts=1 << 40, msg_id=1)
    del msg.proto.fields_data[1]
    payload, props = codec.marshal(msg)
    assert vecview.split_float_vectors(payload) is None
    got = codec.unmarshal(payload, props, float_views=True)
    assert got.float_views is None and got.field_arrays()["pk"] == pa.array([0, 1, 2], pa.int64())


def test_a_wal26_insert_is_viewed_too():
    b = P.insert(P.tt_of(1000), [1, 2, 3])
    viewed = decode_message(b.payload, b.properties, float_views=True)
    assert viewed.wal is not None and viewed.float_views is not None and _viewed(viewed.float_views[1], b.payload)
    assert viewed.field_arrays() == decode_message(b.payload, b.properties).field_arrays()
    assert viewed.field_arrays()["vec"].to_pylist() == [[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]]


def test_float_data_under_another_type_is_parsed_whole_and_fails_as_before():
    msg = insert_msg(0, 4, ts=1 << 40, msg_id=1)
    msg.proto.fields_data[1].type = 5  # Int64, yet carrying float-vector data
    payload, props = codec.marshal(msg)
    for views in (False, True):
        with pytest.raises(DecodeError, match="'vec'.*does not hold a whole number of rows"):
            codec.unmarshal(payload, props, float_views=views)


def test_float_vectors_the_payload_puts_off_a_4_byte_boundary_are_given_aligned():
    """Where the floats lie in the payload depends on the lengths before them (here the collection's name): a view
    off a 4-byte boundary is copied, so every column is aligned. Arrow's Rust readers (Lance's fragment writer, over
    the C data interface) refuse a misaligned float buffer: a mirror job into Lance failed on one ("Memory pointer
    from external source ... is not aligned") once its writer stopped copying the rows."""
    places = set()
    for n in range(1, 9):
        msg = insert_msg(0, 4, ts=1 << 40, msg_id=1)
        msg.proto.collection_name = "c" * n
        payload, props = codec.marshal(msg)
        _, spans = vecview.split_float_vectors(payload)
        place = (np.frombuffer(payload, np.uint8).ctypes.data + spans[1][0]) % 4
        places.add(place)
        got = codec.unmarshal(payload, props, float_views=True)
        assert got.float_views[1].ctypes.data % 4 == 0, n
        assert _inside(got.float_views[1], payload) == (place == 0), n  # a view where it can be, a copy elsewhere
        vec = got.field_arrays()["vec"]
        assert vec.values.buffers()[1].address % 4 == 0, n
        assert vec == codec.unmarshal(payload, props).field_arrays()["vec"]
    assert places == {0, 1, 2, 3}  # every place was met
