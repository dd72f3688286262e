"""2.6 WAL decode against 2.5 msgstream decode of the same inserts, in a read task, without Spark.

    python -m bench.bench_decode26 [--messages 20000] [--rows-per-msg 10] [--profile]

Publishes the same small inserts (int64 pk + 8-d float vector, 10 rows each, a time tick after
each) twice to the embedded log: as 2.5 msgstream messages on one channel and as 2.6 WAL messages
(version-1 body, ``_h`` header, ``_tt``/``_vc``/``_lc`` properties, WAL time ticks) on another.
Then times ``read_partition`` - the code a Spark Python worker runs - over each channel,
interleaved (2.5, 2.6, 2.5, 2.6, ...), and reports the medians: messages/s and the ratio of
2.6's time to 2.5's (goal: <= 1.5). Small messages put the per-message cost in front.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench._util import median, table
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.types import InsertMsg, TimeTickMsg
from msgstream_spark.msg.wal26 import b36encode
from msgstream_spark.msg.wal26 import encode as wal

CH25, CH26 = "dec_25", "dec_26"
COLLECTION, PARTITION, SEGMENT, DIM = 7, 8, 9, 8
REPS = 5


def _inserts(messages: int, rows_per_msg: int):
    """(InsertMsg, time tick) of each message, the same for both formats."""
    rng = np.random.default_rng(0)
    schemas = [field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True),
               field_schema_from_arrow("vec", pa.list_(pa.float32()), field_id=101, dim=DIM)]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows_per_msg * DIM, dtype=np.float32)), DIM)
    ts = 455000614502400000
    for k in range(messages):
        pk = pa.array(np.arange(k * rows_per_msg, (k + 1) * rows_per_msg, dtype=np.int64))
        fds = [arrow_to_field_data(c, s) for c, s in zip([pk, vec], schemas)]
        ts += 1 << 18
        yield InsertMsg.build(fields_data=fds, num_rows=rows_per_msg, timestamp=ts, collection_id=COLLECTION,
                              partition_id=PARTITION, segment_id=SEGMENT, shard_name=f"{CH26}_{COLLECTION}v0",
                              msg_id=k + 1), ts


def publish(cfg: Config, messages: int, rows_per_msg: int) -> None:
    """The same inserts as 2.5 messages on CH25 and as 2.6 WAL messages on CH26, a tick after each."""
    client = build_client(cfg.mq_type, cfg)
    p25, p26 = client.create_producer(CH25), client.create_producer(CH26)
    b25: list[ProducerMessage] = []
    b26: list[ProducerMessage] = []
    vch = f"{CH26}_{COLLECTION}v0"
    lc = b36encode(1)  # every message's last-confirmed id: the log's first message (no open transaction)
    for msg, ts in _inserts(messages, rows_per_msg):
        payload, props = codec.marshal(msg)
        b25.append(ProducerMessage(payload, props, timestamp=ts))
        b25.append(ProducerMessage(*codec.marshal(TimeTickMsg.build(ts + 1)), timestamp=ts + 1))
        p26props = wal.insert_properties(ts, vch, COLLECTION, PARTITION, rows=rows_per_msg,
                                         binary_size=len(payload), segment_id=SEGMENT, last_confirmed=lc)
        b26.append(ProducerMessage(payload, p26props, timestamp=ts))
        b26.append(ProducerMessage(*wal.timetick(ts + 1, last_confirmed=lc), timestamp=ts + 1))
        if len(b25) >= 1000:
            p25.send_batch(b25)
            p26.send_batch(b26)
            b25, b26 = [], []
    if b25:
        p25.send_batch(b25)
        p26.send_batch(b26)
    p25.close()
    p26.close()
    client.close()


def _partitions(path: str, channel: str):
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    ds = MsgStreamDataSource({"mq.type": "local", "local.path": path, "channels": channel})
    return ds.reader(ds.schema() if not isinstance(ds.schema(), str) else None).partitions()


def _read(parts) -> int:
    from msgstream_spark.spark.reader import read_partition

    return sum(b.num_rows for p in parts for b in read_partition(p))


def run(messages: int = 20_000, rows_per_msg: int = 10, reps: int = REPS, profile: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/dec.db"
        cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}})
        publish(cfg, messages, rows_per_msg)
        parts = {v: _partitions(path, ch) for v, ch in (("2.5", CH25), ("2.6", CH26))}
        want = messages * rows_per_msg
        for v, p in parts.items():  # warm up, and both read every row
            got = _read(p)
            if got != want:
                raise RuntimeError(f"{v} read {got} rows, expected {want}")
        runs: dict[str, list[float]] = {"2.5": [], "2.6": []}
        for _ in range(reps):
            for v, p in parts.items():
                t0 = time.perf_counter()
                _read(p)
                runs[v].append(time.perf_counter() - t0)
        t25, t26 = median(runs["2.5"]), median(runs["2.6"])
        if profile:
            pr = cProfile.Profile()
            pr.enable()
            _read(parts["2.6"])
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    res = {"messages": messages, "rows_per_msg": rows_per_msg, "reps": reps,
           "v25_msgs_s": messages / t25, "v26_msgs_s": messages / t26, "v26_time_vs_v25": t26 / t25}
    print(f"-- {messages:,} inserts of {rows_per_msg} rows (+ a tick each), read_partition on the embedded log, "
          f"median of {reps} interleaved runs")
    print(table([("2.5 msgstream inserts", messages / t25, None),
                 ("2.6 WAL inserts (same bodies)", messages / t26, t25 / t26)], unit="inserts/s"))
    print(f"2.6 takes {t26 / t25:.2f}x the time of 2.5 (goal <= 1.5x)", flush=True)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rows-per-msg", type=int, default=10)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    run(a.messages, a.rows_per_msg, a.reps, a.profile)
