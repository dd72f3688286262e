"""Codec throughput: encode/decode of a 1000-row insert (int64 pk, 128-dim float vector, varchar).

Baseline, measured in the same run: bare protobuf ParseFromString plus numpy conversion of
the same three fields (what any decoder must at least do). Goal: decode within 1.2x of its time.
Runs are interleaved and the figures are medians.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from bench._util import median, table
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import InsertMsg

ROWS, DIM, LOOPS, REPS = 1000, 128, 20, 9


def _interleaved(fns: list) -> list[float]:
    """Median seconds of each function, run in turn ``REPS`` times (A/B/C/A/B/C...)."""
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(REPS):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            runs[i].append(time.perf_counter() - t0)
    return [median(r) for r in runs]


def make_columns():
    rng = np.random.default_rng(0)
    pk = pa.array(np.arange(ROWS, dtype=np.int64))
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(ROWS * DIM, dtype=np.float32)), DIM)
    text = pa.array([f"row-{i}-" + "x" * (i % 40) for i in range(ROWS)])
    schemas = [field_schema_from_arrow("pk", pk.type, field_id=100, is_primary_key=True),
               field_schema_from_arrow("vec", vec.type, field_id=101),
               field_schema_from_arrow("text", text.type, field_id=102)]
    return [pk, vec, text], schemas


def run() -> dict:
    cols, schemas = make_columns()

    def encode():
        for _ in range(LOOPS):
            fds = [arrow_to_field_data(c, s) for c, s in zip(cols, schemas)]
            codec.marshal(InsertMsg.build(fields_data=fds, num_rows=ROWS, timestamp=1 << 40, msg_id=1))

    payload, props = codec.marshal(InsertMsg.build(
        fields_data=[arrow_to_field_data(c, s) for c, s in zip(cols, schemas)], num_rows=ROWS,
        timestamp=1 << 40, msg_id=1))

    def decode():
        for _ in range(LOOPS):
            codec.unmarshal(payload, props).to_arrow()

    def baseline():
        from msgstream_spark.msg.pb import msg_pb2

        for _ in range(LOOPS):
            req = msg_pb2.InsertRequest()
            req.ParseFromString(payload)
            fd = req.fields_data
            np.array(fd[0].scalars.long_data.data, dtype=np.int64)
            np.array(fd[1].vectors.float_vector.data, dtype=np.float32).reshape(-1, DIM)
            list(fd[2].scalars.string_data.data)

    t_base, t_dec, t_enc = _interleaved([baseline, decode, encode])
    rows = ROWS * LOOPS
    res = {"rows": ROWS, "dim": DIM, "payload_bytes": len(payload),
           "baseline_rows_s": rows / t_base, "decode_rows_s": rows / t_dec, "encode_rows_s": rows / t_enc,
           "decode_time_vs_baseline": t_dec / t_base, "encode_time_vs_baseline": t_enc / t_base}
    print(table([("baseline: protobuf parse + numpy", rows / t_base, None),
                 ("decode: unmarshal + FieldData -> Arrow", rows / t_dec, t_base / t_dec),
                 ("encode: Arrow -> FieldData + marshal", rows / t_enc, t_base / t_enc)]))
    print(f"decode takes {res['decode_time_vs_baseline']:.2f}x the baseline's time (goal <= 1.2x)")
    return res


if __name__ == "__main__":
    run()
