"""Regressions found by the chaos suite's bad-input generator (issue 12)."""

from __future__ import annotations

import numpy as np
import pytest

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.types import DeleteMsg, TimeTickMsg
from tests.chaos.badinput import insert_msg


def test_a_vector_that_is_not_a_whole_number_of_rows_is_a_decode_error():
    msg = insert_msg(0, 5, ts=1 << 40, msg_id=1)
    msg.proto.fields_data[1].vectors.float_vector.data.extend([0.5, 0.5])  # 22 floats, dim 4: 5 rows and a half
    payload, props = codec.marshal(msg)
    with pytest.raises(DecodeError, match="'vec'.*does not hold a whole number of rows") as ei:
        codec.unmarshal(payload, props, channel="ch", msg_id=b"\x01")
    assert ei.value.channel == "ch" and ei.value.payload == payload


def test_a_vector_of_dim_zero_is_a_decode_error():
    msg = insert_msg(0, 5, ts=1 << 40, msg_id=1)
    msg.proto.fields_data[1].vectors.dim = 0
    with pytest.raises(DecodeError, match="whole number of rows"):
        codec.unmarshal(*codec.marshal(msg))


@pytest.mark.parametrize("other", ["delete", "timetick"])
def test_a_payload_whose_header_disagrees_with_the_msg_type_property_is_a_decode_error(other):
    if other == "delete":
        payload, _ = codec.marshal(DeleteMsg.build(primary_keys=np.arange(3, dtype=np.int64), timestamp=5,
                                                   collection_id=1, msg_id=1))
    else:
        payload, _ = codec.marshal(TimeTickMsg.build(5))
    with pytest.raises(DecodeError, match="msg_type property says Insert but the payload's header says") as ei:
        codec.unmarshal(payload, {"msg_type": "Insert"}, channel="ch", msg_id=b"\x07")
    assert ei.value.msg_id == b"\x07"
