"""2.6 WAL decode against 2.5 msgstream decode of the same inserts, in a read task, without Spark.

    python -m bench.bench_decode26 [--messages 20000] [--rows-per-msg 10] [--profile]

Publishes the same small inserts (int64 pk + 8-d float vector, 10 rows each, a time tick after
each) twice to the embedded log: as 2.5 msgstream messages on one channel and as 2.6 WAL messages
(version-1 body, ``_h`` header whose ``binary_size`` differs per message, ``_tt``/``_vc``/``_lc``
properties, WAL time ticks) on another. Two measures, each interleaved (2.5, 2.6, 2.5, ...):

- decode: the channel decoder every reader uses (``stream.decode.ChannelDecoder``) over the
  channel's messages, fetched once into memory - the figure of the goal (2.6 within 1.5x of 2.5);
- read task: ``read_partition`` - what a Spark Python worker runs: fetch, decode, Arrow rows.

Times are the process's CPU time (``time.process_time``: on a shared machine the wall clock also
counts other processes), medians of the runs. Small messages put the per-message cost in front.
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
        # a header per message (Milvus's binary_size follows the rows' bytes), as with varying row sizes
        p26props = wal.insert_properties(ts, vch, COLLECTION, PARTITION, rows=rows_per_msg,
                                         binary_size=len(payload) + len(b26), segment_id=SEGMENT, last_confirmed=lc)
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
    from msgstream_spark.spark.partitions import read_partition

    return sum(b.num_rows for p in parts for b in read_partition(p))


def _fetch(cfg: Config, channel: str, count: int) -> list:
    """The channel's first ``count`` broker messages, in order."""
    client = build_client(cfg.mq_type, cfg)
    try:
        reader = client.reader(channel)
        reader.seek(client.earliest_message_id(), inclusive=True)
        out: list = []
        while len(out) < count:
            batch = reader.receive_batch(1000, 5.0)
            if not batch:
                raise RuntimeError(f"{channel}: only {len(out)} of {count} messages")
            out.extend(batch)
        reader.unsubscribe()
        return out[:count]
    finally:
        client.close()


def _decode(channel: str, msgs: list) -> int:
    from msgstream_spark.stream.decode import ChannelDecoder

    dec = ChannelDecoder(channel, "local")  # message by message, as a reader feeds it (nothing kept)
    return sum(d.row_bearing for m in msgs for d in dec.feed(m))


def _interleaved(cases: dict, reps: int) -> dict[str, float]:
    """Median CPU seconds of each case, run in turn ``reps`` times."""
    runs: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            t0 = time.process_time()
            fn()
            runs[k].append(time.process_time() - t0)
    return {k: median(v) for k, v in runs.items()}


def run(messages: int = 20_000, rows_per_msg: int = 10, reps: int = REPS, profile: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/dec.db"
        cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}})
        publish(cfg, messages, rows_per_msg)
        raw = {v: _fetch(cfg, ch, 2 * messages) for v, ch in (("2.5", CH25), ("2.6", CH26))}
        parts = {v: _partitions(path, ch) for v, ch in (("2.5", CH25), ("2.6", CH26))}
        want = messages * rows_per_msg
        for v in ("2.5", "2.6"):  # warm up, and check both read every insert and row
            if _decode(v, raw[v]) != messages or _read(parts[v]) != want:
                raise RuntimeError(f"{v}: the decoder or the read task lost messages")
        dec = _interleaved({v: (lambda v=v: _decode(v, raw[v])) for v in raw}, reps)
        task = _interleaved({v: (lambda v=v: _read(parts[v])) for v in parts}, reps)
        if profile:
            pr = cProfile.Profile()
            pr.enable()
            _decode("2.6", raw["2.6"])
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    res = {"messages": messages, "rows_per_msg": rows_per_msg, "reps": reps,
           "decode_v25_msgs_s": messages / dec["2.5"], "decode_v26_msgs_s": messages / dec["2.6"],
           "decode_v26_time_vs_v25": dec["2.6"] / dec["2.5"],
           "task_v25_msgs_s": messages / task["2.5"], "task_v26_msgs_s": messages / task["2.6"],
           "task_v26_time_vs_v25": task["2.6"] / task["2.5"]}
    print(f"-- {messages:,} inserts of {rows_per_msg} rows (+ a tick each) on the embedded log, CPU time, "
          f"median of {reps} interleaved runs")
    print(table([("decode, 2.5 msgstream inserts", messages / dec["2.5"], None),
                 ("decode, 2.6 WAL inserts (same bodies)", messages / dec["2.6"], dec["2.5"] / dec["2.6"]),
                 ("read task, 2.5", messages / task["2.5"], None),
                 ("read task, 2.6", messages / task["2.6"], task["2.5"] / task["2.6"])], unit="inserts/s"))
    print(f"2.6 decode takes {res['decode_v26_time_vs_v25']:.2f}x the time of 2.5 (goal <= 1.5x); "
          f"a read task {res['task_v26_time_vs_v25']:.2f}x", flush=True)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rows-per-msg", type=int, default=10)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    run(a.messages, a.rows_per_msg, a.reps, a.profile)
