"""Helpers shared by the sink, jobs and CLI tests: config files and reading channels back."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from msgstream_spark.mq.base import Message, SubscriptionInitialPosition


def two_part_parquet(directory: Path) -> Path:
    """``<directory>/in``: two Parquet files of 100 rows each (``pk`` 0..199, ``v`` = float(pk))."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = Path(directory) / "in"
    src.mkdir()
    for part in range(2):
        pks = list(range(part * 100, part * 100 + 100))
        pq.write_table(pa.table({"pk": pa.array(pks, pa.int64()), "v": pa.array([float(p) for p in pks])}),
                       src / f"part-{part}.parquet")
    return src


def config_file(env, directory: Path) -> str:
    """Write ``env.config`` as a YAML file (flat dotted keys) and return its path."""
    path = Path(directory) / f"{env.name}-{uuid.uuid4().hex[:6]}.yaml"
    values = {k: v for k, v in env.config.values.items() if v not in ("", None)}
    values["mq.type"] = env.name
    path.write_text(yaml.safe_dump(values))
    return str(path)


@dataclass
class Read:
    channel: str
    raw: Message
    msg: object  # TsMsg

    @property
    def type_name(self) -> str:
        from msgstream_spark.msg.pb import common_pb2

        return common_pb2.MsgType.Name(self.msg.proto.base.msg_type)


def read_channel(client, channel: str, timeout: float = 30.0) -> list[Read]:
    """Every message of ``channel`` up to its latest id, decoded (bounded by ``timeout``)."""
    from msgstream_spark.msg import codec

    last = client.latest_message_id(channel)
    if last is None:
        return []
    out: list[Read] = []
    deadline = time.monotonic() + timeout
    with client.subscribe(channel, f"test-{uuid.uuid4().hex[:8]}", SubscriptionInitialPosition.EARLIEST) as cons:
        while time.monotonic() < deadline:
            batch = cons.receive_batch(1024, 1.0)
            for m in batch:
                out.append(Read(channel, m, codec.unmarshal(m.payload, m.properties, channel=channel,
                                                            msg_id=m.id.serialize())))
            if out and out[-1].raw.id >= last:
                return out
    raise AssertionError(f"reading {channel} did not reach its latest message within {timeout}s")


def read_all(client, channels) -> dict[str, list[Read]]:
    return {ch: read_channel(client, ch) for ch in channels}


def inserted_rows(reads: list[Read]) -> list[dict]:
    """Rows of every InsertMsg (columns by field name), in channel order."""
    from msgstream_spark.msg.columns import field_data_to_arrow

    rows: list[dict] = []
    for r in reads:
        if r.type_name != "Insert":
            continue
        p = r.msg.proto
        cols = {fd.field_name: field_data_to_arrow(fd).to_pylist() for fd in p.fields_data}
        for i in range(int(p.num_rows)):
            rows.append({k: v[i] for k, v in cols.items()})
    return rows


def deleted_keys(reads: list[Read]) -> list:
    out = []
    for r in reads:
        if r.type_name != "Delete":
            continue
        ids = r.msg.proto.primary_keys
        out.extend(ids.int_id.data if ids.HasField("int_id") else ids.str_id.data)
    return out
