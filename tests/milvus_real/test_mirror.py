"""jobs/mirror.py against the real Milvus 2.3.5: the table equals what ``query`` returns.

A writer keeps inserting, deleting and upserting through pymilvus while the job takes its snapshot
(positions, S, Strong queries by pk ranges in Spark tasks) and after it; at the end each table equals
``query(output_fields=["*"])`` row for row, vectors bit for bit. Two collections on the same channels
go to two tables (Delta in a local directory, Iceberg on the S3 server). Also: ``--snapshot never`` from
Milvus's etcd channel checkpoints, exactly once across a driver SIGKILL between the table commit and Spark's
commit (into a table on the S3 server) or before the table commit (a local one), and bad input (one clear error
each, nothing written). A table on the S3 server (issue #37) is also read by plain readers with the same storage
options, and ``mirror verify`` passes on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.milvus_real.test_milvus_oracle import FIELDS, _etcd_range, await_ticks, milvus_rows, pchannels
from tests.milvus_real.workload import Workload, create_all_types, load_for_query, normalize

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg(milvus_stack, tmp_path_factory) -> str:
    """The job's config: the cluster's MQ (Kafka through the shim, or pulsar-lite) and the proxy as
    ``milvus.address``."""
    values = {k: v for k, v in milvus_stack.env.config.values.items() if v not in ("", None)}
    values["mq.type"] = milvus_stack.mq
    values["milvus.address"] = milvus_stack.uri.removeprefix("http://")
    path = tmp_path_factory.mktemp("mirror-cfg") / "cluster.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def job_args(cfg: str, collection: str, table: Path, fmt: str, *extra: str):
    from msgstream_spark.jobs import mirror

    return mirror.build_parser().parse_args([
        "--config", cfg, "--collection", collection, "--table", str(table), "--table-format", fmt,
        "--progress-interval", "1", "--max-rows-per-trigger", "500", *extra])


def run_job(spark, cfg, collection, table, fmt, *extra):
    from msgstream_spark.jobs import mirror

    return mirror.run(job_args(cfg, collection, table, fmt, *extra), spark)


def table_rows(table: Path | str, fmt: str, collection: str, pk: str = "pk", **where) -> dict[int, dict]:
    """The table's rows (``where``: open_table's storage_options / catalog_uri for a table on the S3 server)."""
    from msgstream_spark.mirror.table import open_table

    t = open_table(fmt, str(table), collection=collection, pk=pk, create=False, **where)
    return by_pk(t.to_arrow())


def key_difference(table: Path | str, fmt: str, w: Workload, got, want, stack=None, differ=(), **where) -> str:
    """What a failing comparison needs to be diagnosed: the keys the table lacks / has beyond Milvus / holds
    with other values (``differ``), the acknowledged writes that touched them (kind, keys, Milvus time), the
    snapshot's S and positions, and (``stack``: the MQ to read) every message of the log that touched them with
    its channel, id, time and side of the table's start position, and the TimeTicks next to them."""
    from msgstream_spark.mirror.table import open_table

    lacks, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    odd = set(lacks[:20] + extra[:20] + sorted(differ)[:20])
    writes = [(a.kind, [k for k in a.pks if k in odd], a.ts) for a in w.acked if odd & set(a.pks)]
    props = open_table(fmt, str(table), collection=w.name, pk="pk", create=False, **where).properties()
    start = {k: v for k, v in props.items() if "snapshot" in k or "start" in k}
    text = (f"table lacks {lacks[:20]}, has extra {extra[:20]}, differs at {sorted(differ)[:20]}; writes of those "
            f"keys: {writes}; table: {start}")
    if stack is not None and odd:
        try:
            text += f"; the log of those keys: {log_of_keys(stack, w, odd, props.get('msgstream.mirror.start'))}"
        except Exception as exc:  # noqa: BLE001 - a diagnosis only: the comparison's failure is what counts
            text += f"; the log of those keys could not be read: {exc!r}"
    return text


def log_of_keys(stack, w: Workload, keys: set, start: str | None) -> list[tuple]:
    """(channel, message id, kind, Milvus time, keys, side of the start position) of every Insert and Delete of
    ``w``'s collection that touched ``keys``, of the TimeTicks right before and after them, and of each start
    position's own message ("start": the side is "before/at" or "after" the channel's start position)."""
    from msgstream_spark.msg.position import MsgPosition

    cid = int(w.collection.describe()["collection_id"])
    starts = {ch: MsgPosition.from_base64(v) for ch, v in json.loads(start).items() if v != "earliest"} if start else {}
    out: list[tuple] = []
    with stack.env.client() as c:
        for ch in pchannels(w.collection._using, w.name):
            pos = c.bytes_to_message_id(starts[ch].msg_id) if ch in starts else None
            log = list(_channel_log(c, ch, cid, keys))
            want = set()
            for i, (m, _, _, hit) in enumerate(log):
                if hit:
                    want |= {i} | {j for j in (i - 1, i + 1) if 0 <= j < len(log) and log[j][1] == "tick"}
                if pos is not None and m == pos:
                    want.add(i)
            for i in sorted(want):
                m, kind, ts, hit = log[i]
                side = "" if pos is None else ("start" if m == pos else "after" if pos < m else "before")
                out.append((ch, str(m), kind, ts, sorted(hit), side))
    return out


def _channel_log(client, ch: str, cid: int, keys: set):
    """(id, kind, Milvus time, keys of ``keys`` it touched) of every message of ``ch`` up to its last one:
    TimeTicks, and the Inserts and Deletes of collection ``cid``."""
    from msgstream_spark.msg.codec import unmarshal
    from msgstream_spark.msg.types import MsgType

    last = client.latest_message_id(ch)
    if last is None:
        return
    r = client.reader(ch)
    try:
        r.seek(client.earliest_message_id(), inclusive=True)
        done = False
        while not done:
            batch = r.receive_batch(512, 10.0)
            if not batch:
                return
            for m in batch:
                done = done or not m.id < last
                try:
                    msg = unmarshal(m.payload, m.properties)
                except Exception:  # noqa: BLE001 - types this library does not decode: no row change
                    continue
                p = msg.proto
                ts = int(p.timestamps[0]) if getattr(p, "timestamps", None) else int(p.base.timestamp)
                if msg.msg_type == MsgType.TimeTick:
                    yield m.id, "tick", ts, set()
                elif msg.msg_type == MsgType.Insert and int(p.collectionID) == cid:
                    pks = next((list(f.scalars.long_data.data) for f in p.fields_data if f.field_name == "pk"), [])
                    yield m.id, "insert", ts, keys & set(pks)
                elif msg.msg_type == MsgType.Delete and int(p.collectionID) == cid:
                    yield m.id, "delete", ts, keys & set(p.primary_keys.int_id.data)
    finally:
        r.unsubscribe()


def by_pk(rows) -> dict[int, dict]:
    return {r["pk"]: normalize({k: r.get(k) for k in FIELDS}) for r in rows.to_pylist()}


def assert_table_equals_query(table: Path | str, fmt: str, w: Workload, stack=None, **where) -> None:
    want = milvus_rows(w.collection)
    got = table_rows(table, fmt, w.name, **where)
    assert sorted(got) == sorted(want), key_difference(table, fmt, w, got, want, stack, **where)
    bad = [pk for pk in want if got[pk] != want[pk]]
    assert not bad, (f"{len(bad)} rows differ, e.g. pk {bad[0]}: table {got[bad[0]]} vs Milvus {want[bad[0]]}; "
                     + key_difference(table, fmt, w, got, want, stack, bad, **where))
    for pk in want:  # vectors bit for bit
        assert np.asarray(got[pk]["fv"], np.float32).tobytes() == np.asarray(want[pk]["fv"], np.float32).tobytes()


@dataclass
class OnS3:
    """A table on the S3 server (tests/fixtures/s3_env.py): its URI, the job's arguments for it (the server's
    settings as ``--storage-option``, Spark's checkpoint on the driver's disk; Iceberg: the SQL catalog in a SQLite
    file on the driver's disk, ``--catalog-uri``) and open_table's keyword arguments."""

    uri: str
    args: tuple[str, ...]
    where: dict

    @classmethod
    def make(cls, s3, tmp_path: Path, name: str, fmt: str) -> OnS3:
        opts = s3.options()
        args = [*(f"--storage-option={k}={v}" for k, v in opts.items()), "--checkpoint",
                str(tmp_path / f"{name}_checkpoint")]
        where = {"storage_options": opts}
        if fmt == "iceberg":
            where["catalog_uri"] = f"sqlite:///{tmp_path / f'{name}_catalog.sqlite'}"
            args += ["--catalog-uri", where["catalog_uri"]]
        return cls(s3.uri("lake", name), tuple(args), where)


def plain_reads(table: str, fmt: str, collection: str, where: dict) -> list[dict[int, dict]]:
    """The rows of a table on the S3 server as readers that share none of the mirror's code read them, each with
    the same storage options: delta-rs's SQL and DuckDB's delta extension (deletion vectors applied), or pyiceberg
    through the same SQL catalog and DuckDB's iceberg extension (position deletes applied)."""
    import pyarrow as pa

    from tests.fixtures.plain_readers import duckdb_on_s3

    opts = where["storage_options"]
    if fmt == "delta":
        import deltalake

        dt = deltalake.DeltaTable(table, storage_options=opts)
        first = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
        scan = f"delta_scan('{table}')"
        con = duckdb_on_s3(opts)
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        from msgstream_spark.mirror.store.settings import for_pyiceberg

        # pyiceberg's SQL catalog keeps each catalog name's tables apart: the mirror's is "msgstream"
        cat = SqlCatalog("msgstream", uri=where["catalog_uri"], **for_pyiceberg(opts))
        tbl = cat.load_table(("msgstream", collection))
        assert tbl.location() == table
        first = tbl.scan().to_arrow()
        scan = f"iceberg_scan('{tbl.metadata_location}')"
        con = duckdb_on_s3(opts, ("httpfs", "avro", "iceberg"))
    return [by_pk(first), by_pk(con.execute(f"SELECT * FROM {scan}").fetch_arrow_table())]


def verify_on_s3(capsys, cfg: str, collection: str, on: OnS3) -> dict:
    """``msgstream mirror verify`` on a table on the S3 server (the table's format found in the bucket): its
    summary; it exits 0 (equal), and no secret is in what it printed."""
    from msgstream_spark.cli.main import main

    capsys.readouterr()
    rc = main(["mirror", "verify", "--config", cfg, "--collection", collection, "--table", on.uri, *on.args])
    out = capsys.readouterr().out
    assert on.where["storage_options"]["aws_secret_access_key"] not in out
    summary = json.loads(out.splitlines()[-1])["summary"]
    assert rc == 0 and summary["equal"], out[-2000:]
    return summary


class Writer:
    """Keeps inserting new keys, deleting and upserting existing ones, until stopped (or ROUNDS rounds)."""

    PACE_S, ROUNDS = 0.5, 120

    def __init__(self, workloads: list[Workload], first_new: int) -> None:
        self.workloads, self.next = workloads, first_new
        self.stop_event = threading.Event()
        self.wrote = threading.Event()  # set after the first round's writes
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        i = 0
        # Bounded: at most ROUNDS rounds, one every PACE_S, so that it spans a job's run (60 s). What the tests need
        # is a write after the snapshot's S and writes while the stream catches up; more rounds only add rows to
        # stream and calls for Milvus to serve (a 0.05 s pace wrote ~4x as many as 0.2 s, 0.2 s 2.5x as many as
        # 0.5 s, for the same assertions).
        try:
            while i < self.ROUNDS and not self.stop_event.wait(self.PACE_S):
                for w in self.workloads:
                    w.insert(range(self.next, self.next + 10))
                    if i % 2 == 0:
                        w.upsert(range(self.next - 40, self.next - 35), gen=1 + i % 3)
                    if i % 3 == 0:
                        w.delete(list(range(i * 3, i * 3 + 3)))
                self.next += 10
                i += 1
                self.wrote.set()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
            self.wrote.set()

    def first_round(self, timeout: float = 60.0) -> Writer:
        """Wait (bounded) until the first round's writes are acknowledged."""
        assert self.wrote.wait(timeout), f"the writer's first round took over {timeout:.0f} s"
        if self.error is not None:
            raise self.error
        return self

    def start(self) -> Writer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "writer did not stop"
        if self.error is not None:
            raise self.error


def last_ts(*ws: Workload) -> int:
    return max(a.ts for w in ws for a in w.acked if a.ts)


@dataclass
class Plan:
    """One collection of ``rows`` rows mirrored into a ``fmt`` table with ``extra`` job arguments."""

    name: str
    rows: int
    fmt: str
    extra: tuple[str, ...] = ()
    s3: OnS3 | None = None  # the table on the S3 server (default: a directory in tmp_path)


def snapshot_while_writing(spark, stack, alias: str, cfg: str, tmp_path: Path, plans: list[Plan]) -> dict[str, dict]:
    """The driver: each plan's collection is filled, then ``--snapshot initial`` runs while a writer inserts,
    deletes and upserts (during the snapshot and after it); a second run resumes from the checkpoint and each
    table equals ``query``. Returns the first run's summary per collection."""
    ws = {p.name: Workload(p.name, create_all_types(alias, p.name)) for p in plans}
    for p in plans:
        ws[p.name].insert(range(0, p.rows // 2))
        ws[p.name].insert(range(p.rows // 2, p.rows))
        load_for_query(ws[p.name].collection, flushed=False)  # for the snapshot's queries
    before = {name: len(w.acked) for name, w in ws.items()}
    chans = {p.name: ["--channels", ",".join(pchannels(alias, p.name)), *(p.s3.args if p.s3 else ())]
             for p in plans}
    table = {p.name: p.s3.uri if p.s3 else tmp_path / p.name for p in plans}
    summaries = {}
    for p in plans:
        # writes during the snapshot and after it; its first round before the job starts: the job infers the
        # stream's schema from the channels' newest 512 messages (schemaScanMessages), where the collection's
        # first rows, written before the other plan's run, may no longer be (a run under load failed so)
        writer = Writer([ws[p.name]], first_new=p.rows).start().first_round()
        try:
            summaries[p.name] = run_job(spark, cfg, p.name, table[p.name], p.fmt, *p.extra, *chans[p.name])
        finally:
            writer.stop()
    for name, s in summaries.items():
        assert s["snapshot"]["mode"] == "initial"
        assert s["snapshot"]["files"] >= 1 and s["snapshot"]["rows"] >= 1
        later = [x for x in ws[name].acked[before[name]:] if x.ts and x.ts > s["snapshot"]["S"]]
        assert later, f"{name}: no write after S: the writer did not overlap the snapshot"
    await_ticks(stack, last_ts(*ws.values()), sorted({c for name in ws for c in pchannels(alias, name)}))
    for p in plans:  # from its checkpoint
        assert run_job(spark, cfg, p.name, table[p.name], p.fmt, *chans[p.name])["snapshot"]["mode"] == "resumed"
    for p in plans:
        assert_table_equals_query(table[p.name], p.fmt, ws[p.name], stack, **(p.s3.where if p.s3 else {}))
        if p.s3:
            want = milvus_rows(ws[p.name].collection)
            assert all(got == want for got in plain_reads(p.s3.uri, p.fmt, p.name, p.s3.where))
    return summaries


def test_snapshot_while_writing_then_stream_equals_query(spark, milvus_stack, pymilvus_orm, cfg, tmp_path, s3,
                                                         capsys):
    """Delta in a local directory, Iceberg on the S3 server (its catalog in SQLite on the driver's disk; local
    Iceberg: tests/milvus_real_pulsar/test_mirror.py and test_mirror_keys.py); ``mirror verify`` passes on it."""
    on = OnS3.make(s3, tmp_path, "mir_b", "iceberg")
    plans = [Plan("mir_a", 3000, "delta", ("--snapshot-tasks", "3")), Plan("mir_b", 1200, "iceberg", s3=on)]
    summaries = snapshot_while_writing(spark, milvus_stack, pymilvus_orm, cfg, tmp_path, plans)
    assert verify_on_s3(capsys, cfg, "mir_b", on)["rows"]["milvus"] > 1200
    assert summaries["mir_a"]["snapshot"]["ranges"] == 3
    assert s3.options()["aws_secret_access_key"] not in json.dumps(summaries, default=str)
    for s in summaries.values():  # Milvus 2.3.5 does not pin iterator reads: each range reads at its own time >= S
        assert s["snapshot"]["pinned"] is False and s["snapshot"]["read"].startswith("at least at S")


def test_positions_cover_every_message_before_them(milvus_stack, pymilvus_orm):
    """Milvus 2.3.5's TimeTicks follow data newer than themselves (its proxy reports a channel's pending writes'
    smallest timestamp minus one; seen between an upsert's Insert and Delete too): positions taken while a
    writer inserts and upserts carry the newest time of the messages up to them, so that S covers every
    message a resume from them does not read (issue: the one-key loss of the test above, whose S was a tick's
    time with the upsert's Insert before it and its Delete after it). Positions are taken until one sits
    where the last message was older than a message before it (bounded)."""
    from msgstream_spark.mirror.snapshot.handover import take_positions

    w = Workload("mir_pos", create_all_types(pymilvus_orm, "mir_pos"))
    w.insert(range(0, 100))
    chans = pchannels(pymilvus_orm, "mir_pos")
    stop, taken, raised = threading.Event(), [], []

    def write() -> None:
        i = 0
        while not stop.is_set() and i < 2000:
            w.insert(range(100 + 10 * i, 110 + 10 * i))
            w.upsert(range(10 * (i % 10), 10 * (i % 10) + 5), gen=1 + i % 3)
            i += 1

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        with milvus_stack.env.client() as c:
            while len(taken) < 40 and not raised:
                taken.append(take_positions(c, chans))
                raised = [ch for ch, p in taken[-1].items() if _own_time(c, ch, p) < p.timestamp]
    finally:
        stop.set()
        t.join(60)
    with milvus_stack.env.client() as c:
        times = {ch: _times(c, ch, max(c.bytes_to_message_id(p[ch].msg_id) for p in taken)) for ch in chans}
        for positions in taken:
            for ch, p in positions.items():
                mid = c.bytes_to_message_id(p.msg_id)
                before = [tt for m, _, tt in times[ch] if not mid < m]
                assert max(before) <= p.timestamp, f"{ch}: a message before position {mid} is newer than its time"
    assert raised, f"no position in {len(taken)} sat after data newer than its last message"


def _times(client, ch: str, last) -> list:
    """(id, is a tick, Milvus time) of ``ch``'s messages up to ``last``."""
    from msgstream_spark.stream.timeseek import tick_and_time

    r = client.reader(ch)
    out: list = []
    try:
        r.seek(client.earliest_message_id(), inclusive=True)
        while not out or out[-1][0] < last:
            batch = r.receive_batch(512, 10.0)
            assert batch, f"{ch}: the messages up to {last} did not arrive"
            out += [(m.id, *tick_and_time(m.payload, m.properties)) for m in batch if not last < m.id]
    finally:
        r.unsubscribe()
    return [(m, tick, tt or 0) for m, tick, tt in out]


def _own_time(client, ch: str, p) -> int:
    """The Milvus time of the message at position ``p`` itself."""
    from msgstream_spark.stream.timeseek import message_time

    r = client.reader(ch)
    try:
        r.seek(client.bytes_to_message_id(p.msg_id), inclusive=True)
        got = r.receive_batch(1, 10.0)
    finally:
        r.unsubscribe()
    assert got, f"{ch}: the message of position {p} did not arrive"
    return message_time(got[0].payload, got[0].properties) or 0


def test_never_from_milvus_etcd_channel_checkpoints(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    from msgstream_spark.msg.position import MsgPosition
    from msgstream_spark.stream.names import to_physical_channel

    w = Workload("mir_cp", create_all_types(pymilvus_orm, "mir_cp"))
    w.insert(range(0, 300))
    load_for_query(w.collection)  # flushed: Milvus keeps channel checkpoints in etcd
    cid = w.collection.describe()["collection_id"]
    cps = [v for k, v in _etcd_range(milvus_stack, "by-dev/meta/datacoord-meta/channel-cp/").items()
           if f"_{cid}v" in k]
    assert len(cps) == 2
    w.insert(range(300, 400))
    w.delete(range(300, 306))
    w.upsert(range(310, 316), gen=1)
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_cp"))
    chans = sorted({to_physical_channel(MsgPosition.from_proto_bytes(v).channel_name) for v in cps})
    spec = ",".join(__import__("base64").b64encode(v).decode() for v in cps)
    s = run_job(spark, cfg, "mir_cp", tmp_path / "t", "delta", "--snapshot", "never", "--starting", spec,
                "--channels", ",".join(chans))
    assert s["snapshot"]["mode"] == "never"
    got = table_rows(tmp_path / "t", "delta", "mir_cp")
    want = {pk: r for pk, r in milvus_rows(w.collection).items() if pk >= 300}
    assert got == want and sorted(got) == list(range(306, 400))


@pytest.mark.parametrize("failpoint,store", [("kill-after-commit:first", "s3"), ("kill-after-files:first", "local")])
def test_exactly_once_across_a_driver_sigkill_between_the_two_commits(spark, milvus_stack, pymilvus_orm, cfg,
                                                                      tmp_path, capsys, request, failpoint, store):
    """SIGKILL of the driver (and its JVM) after the table commit and before Spark's, or after the tasks wrote a
    batch's files and before the table commit: the rerun skips / applies the batch once, the table equals
    ``query``, no file is referenced twice, the killed batch's files are orphans until its re-run deletes them.

    The first into a table on the S3 server (the killed driver had put the version with ``If-None-Match: *``; its
    endpoint by ``--storage-option``, its credentials from AWS_* variables, Spark's checkpoint on the driver's
    disk; the rerun in this process with every setting as ``--storage-option``): plain readers read it, and
    ``mirror verify`` on it exits 0. (Locally: tests/mirror_job/test_mirror_kills.py.)"""
    from msgstream_spark.mirror.maintenance import classify_orphans, orphans, vacuum
    from msgstream_spark.mirror.table import open_table
    from msgstream_spark.spark.mirror import FAILPOINT_ENV, checkpoint_query_id

    name = "mir_kill" if failpoint.startswith("kill-after-commit") else "mir_killf"
    w = Workload(name, create_all_types(pymilvus_orm, name))
    for lo in range(0, 1500, 500):
        w.insert(range(lo, lo + 500))
    w.delete(range(0, 20))
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, name))
    checkpoint = tmp_path / "t_checkpoint"
    env = dict(os.environ, **{FAILPOINT_ENV: failpoint}, PYTHONPATH=str(ROOT))
    if store == "s3":
        s3 = request.getfixturevalue("s3")
        on = OnS3.make(s3, tmp_path, "t", "delta")
        table, where, secret = on.uri, on.where, s3.options()["aws_secret_access_key"]
        rerun = list(on.args)  # every setting as an option; the checkpoint: t_checkpoint
        first = ["--storage-option", f"aws_endpoint={s3.endpoint}", "--storage-option", "aws_allow_http=true",
                 "--checkpoint", str(checkpoint)]
        env.update({k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"})
    else:
        table, where, secret, rerun, first = str(tmp_path / "t"), {}, None, [], []
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, name))]
    argv = ["--config", cfg, "--collection", name, "--table", table, "--table-format", "delta",
            "--snapshot", "never", "--max-rows-per-trigger", "500", "--master", "local[2]", *chans, *first]
    proc = subprocess.run([sys.executable, "-m", "jobs.mirror", *argv], cwd=tmp_path, env=env, timeout=600,
                          capture_output=True, text=True, start_new_session=True)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert secret is None or secret not in proc.stdout + proc.stderr
    qid = checkpoint_query_id(str(checkpoint))
    t = open_table("delta", table, collection=name, pk="pk", create=False, **where)
    killed = t.last_batch(qid)
    if failpoint.startswith("kill-after-commit"):
        assert killed is not None  # the table took the batch; Spark's commit of it never happened
        assert not (checkpoint / "commits" / str(killed)).exists()
        assert (checkpoint / "offsets" / str(killed)).exists()
        lost = []
    else:
        lost = classify_orphans(t, orphans(t)).left_by_writers  # (the job's compactions leave expired history)
        assert lost and all("/data/" in p for p in lost)  # the tasks' files, in no version of the table
    s = run_job(spark, cfg, name, table, "delta", "--snapshot", "never", *chans, *rerun)
    assert s["skipped_batches"] == (1 if failpoint.startswith("kill-after-commit") else 0)
    load_for_query(w.collection, flushed=False)  # for query
    assert_table_equals_query(table, "delta", w, **where)
    import deltalake

    batches = [h.get("msgstream.batch_id") for h in deltalake.DeltaTable(table, **where).history()]
    if killed is not None:
        assert batches.count(str(killed)) == 1
    t = open_table("delta", table, collection=name, pk="pk", create=False, **where)
    paths = [f.path for f in t.live_files()]
    assert len(paths) == len(set(paths))
    # the batch's re-run deleted the killed attempt's data files (its tasks claimed them) and its changes files
    assert not [p for p in lost if t.store.head(p) is not None]
    vacuum(t, retain_s=0)
    assert not [p for p in orphans(t) if p.endswith(".parquet")]
    assert_table_equals_query(table, "delta", w, **where)
    if store == "s3":
        want = milvus_rows(w.collection)
        assert all(got == want for got in plain_reads(table, "delta", name, where))
        assert verify_on_s3(capsys, cfg, name, on)["rows"]["milvus"] == len(want)
        assert secret not in json.dumps(s, default=str)


def test_bad_input_one_clear_error_and_nothing_written(spark, milvus_stack, pymilvus_orm, cfg, tmp_path, capsys):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.jobs._common import main_wrapper

    w = Workload("mir_bad", create_all_types(pymilvus_orm, "mir_bad"))
    w.insert(range(0, 50))
    load_for_query(w.collection, flushed=False)

    def fails(argv) -> str:
        capsys.readouterr()
        assert main_wrapper(mirror.build_parser(), lambda a: mirror.run(a, spark), argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        return err[-1]

    base = ["--config", cfg, "--table-format", "delta"]
    msg = fails([*base, "--collection", "no_such_collection", "--table", str(tmp_path / "u")])
    assert "no_such_collection" in msg
    assert not (tmp_path / "u").exists()
    no_addr = tmp_path / "no-address.yaml"
    no_addr.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(Path(cfg).read_text()).items()
                                       if k != "milvus.address"}))
    msg = fails(["--config", str(no_addr), "--table-format", "delta", "--collection", "mir_bad",
                 "--table", str(tmp_path / "m")])
    assert "milvus.address" in msg and not (tmp_path / "m").exists()
    bin_table = tmp_path / "other"  # a table of another collection (bin_parts: VarChar key, binary vector)
    import pyarrow as pa

    from msgstream_spark.mirror.table import open_table

    open_table("delta", str(bin_table), collection="mir_bad", pk="pk", create=True,
               arrow_schema=pa.schema([("pk", pa.int64()), ("bv", pa.binary())]))
    before = sorted(p.name for p in (bin_table / "_delta_log").iterdir())
    msg = fails([*base, "--collection", "mir_bad", "--table", str(bin_table)])
    assert "schema" in msg and "bv" in msg
    assert sorted(p.name for p in (bin_table / "_delta_log").iterdir()) == before
    assert json.dumps(before)


def _unreadable_checkpoint(cfg: str, checkpoint: Path) -> list[str]:
    """Point the checkpoint's last committed offset past each channel's log end: the resume position the
    Kafka backend's seek reports as data loss (a log that lost its messages), as retention would."""
    from msgstream_spark.config.loader import Config
    from msgstream_spark.stream.factory import Factory

    last = max(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    path = checkpoint / "offsets" / str(last)
    lines = path.read_text().splitlines()
    offset = json.loads(lines[2])
    with Factory(Config.load(cfg)).client() as c:
        gone = __import__("base64").b64encode(c.message_id_from_offset(10**9).serialize()).decode()
    for e in offset.values():
        e["msgID"] = gone
    path.write_text("\n".join([*lines[:2], json.dumps(offset, sort_keys=True)]) + "\n")
    return sorted(offset)


def test_when_needed_resnapshots_a_table_whose_resume_position_is_gone(spark, milvus_stack, pymilvus_orm, cfg,
                                                                      tmp_path):
    """Issue #20: ``--snapshot when_needed`` replaces the table by a new snapshot in one commit when the
    stream's resume position is no longer readable; ``initial`` on that table stays the data-loss error."""
    import deltalake

    from msgstream_spark.jobs.mirror_start import START_PROPERTY

    w = Workload("mir_wn", create_all_types(pymilvus_orm, "mir_wn"))
    w.insert(range(0, 400))
    load_for_query(w.collection, flushed=False)  # for the snapshot's queries
    chans = ["--channels", ",".join(pchannels(pymilvus_orm, "mir_wn"))]
    table, checkpoint = tmp_path / "t", tmp_path / "t_checkpoint"
    first = run_job(spark, cfg, "mir_wn", table, "delta", "--snapshot", "when_needed", *chans)
    assert first["snapshot"]["mode"] == "initial"
    w.insert(range(400, 600))
    w.delete(range(0, 50))
    w.upsert(range(100, 120), gen=1)
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_wn"))
    run_job(spark, cfg, "mir_wn", table, "delta", *chans)  # a committed stream batch to resume after
    lost = _unreadable_checkpoint(cfg, checkpoint)
    version = deltalake.DeltaTable(str(table)).version()
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException, match="DataLossError: channel .* past the end of the log"):
        run_job(spark, cfg, "mir_wn", table, "delta", *chans)  # --snapshot initial: the clear error
    assert deltalake.DeltaTable(str(table)).version() == version
    w.insert(range(600, 700))
    w.delete(range(50, 60))
    s = run_job(spark, cfg, "mir_wn", table, "delta", "--snapshot", "when_needed", *chans)
    assert s["snapshot"]["mode"] == "replaced" and sorted(s["snapshot"]["lost"]) == lost
    assert s["snapshot"]["S"] > first["snapshot"]["S"]
    assert os.path.isdir(s["snapshot"]["old_checkpoint"]) and (checkpoint / "commits").is_dir()
    dt = deltalake.DeltaTable(str(table))
    assert [h["operation"] for h in dt.history()].count("WRITE") == 1  # the replace commit
    assert json.loads(dt.metadata().configuration[START_PROPERTY]) == s["snapshot"]["positions"]
    w.insert(range(700, 750))
    await_ticks(milvus_stack, last_ts(w), pchannels(pymilvus_orm, "mir_wn"))
    again = run_job(spark, cfg, "mir_wn", table, "delta", "--snapshot", "when_needed", *chans)
    assert again["snapshot"]["mode"] == "resumed"
    load_for_query(w.collection, flushed=False)  # loaded already: the index and load are no-ops
    assert_table_equals_query(table, "delta", w)


def test_snapshot_while_writing_into_a_lance_table_then_stream_equals_query(spark, milvus_stack, pymilvus_orm, cfg,
                                                                             tmp_path):
    """The same into a Lance table (#46 part 4): the snapshot's files become its first fragments, the stream's
    batches its versions; at the end it equals ``query``, vectors bit for bit, and its float vectors are
    fixed-size lists."""
    import lance
    import pyarrow as pa

    summaries = snapshot_while_writing(spark, milvus_stack, pymilvus_orm, cfg, tmp_path,
                                       [Plan("mir_l", 1200, "lance", ("--snapshot-tasks", "2"))])
    assert summaries["mir_l"]["snapshot"]["rows"] >= 1
    assert pa.types.is_fixed_size_list(lance.dataset(str(tmp_path / "mir_l")).schema.field("fv").type)
