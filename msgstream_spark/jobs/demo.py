"""The demo (``make demo``): publish, ingest, save a position, publish more, replay, summarize.

On the embedded backend in ``demo-output/`` (recreated each run):
1. publish a synthetic collection (100k rows, 128-dim vectors) and delete 5% of it, on 2 channels;
2. ingest the channels with Trigger.AvailableNow into a Parquet change log;
3. save the channels' latest positions;
4. publish more rows (and deletes);
5. replay from the saved position into another table, and ingest again (incremental);
6. print rows per op and per channel, positions and throughput, and check the counts;
7. mirror the collection into a table of the registry's default format, Delta (``mirror run --snapshot never``:
   the embedded log holds every event, and there is no Milvus to snapshot from) and show a few of its rows next
   to what the collection holds, computed from what the demo published (the synthetic rows minus the deleted
   keys).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.dataset as ds

from msgstream_spark.cli.vocab import UsageError, add_flag, split_channels, warn_deprecated
from msgstream_spark.errors import MsgStreamError
from msgstream_spark.jobs._common import main_wrapper, spark_session

CHANNEL_PREFIX = "demo-dml_"
DEFAULT_CHANNELS = 2


class _ChannelsOrCount(argparse.Action):
    """``--channels``: channel names, as everywhere; a plain integer is the old count (deprecated)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values.strip().isdigit():
            warn_deprecated(parser.prog, f"{option_string} {values} (a count)",
                            f"--num-channels {values}; --channels takes channel names")
            namespace.channel_count = int(values)
        else:
            namespace.channels = values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    add_flag(p, ("--num-rows",), old=("--rows",), dest="rows", type=int, default=100_000, metavar="N",
             help="rows of the first publish (default 100000)")
    add_flag(p, ("--num-more-rows",), old=("--more-rows",), dest="more_rows", type=int, default=20_000, metavar="N",
             help="rows of the second publish (default 20000)")
    p.add_argument("--dim", type=int, default=128, help="vector dimension (default 128)")
    p.add_argument("--delete-fraction", type=float, default=0.05, help="fraction of keys deleted (default 0.05)")
    p.add_argument("--num-channels", type=int, default=None, metavar="N",
                   help=f"number of channels, named {CHANNEL_PREFIX}<i> (default {DEFAULT_CHANNELS})")
    p.add_argument("--channels", "-c", action=_ChannelsOrCount, default=None, metavar="A,B",
                   help="or the channels' names (comma-separated)")
    p.set_defaults(channel_count=None)
    p.add_argument("--workdir", default="demo-output", help="output directory, recreated (default demo-output)")
    add_flag(p, ("--num-tasks",), old=("--partitions",), dest="partitions", type=int, default=2, metavar="N",
             help="Spark write tasks (default 2)")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    return p


def channel_names(args: argparse.Namespace) -> list[str]:
    """The demo's channels: ``--channels`` names them, ``--num-channels`` (or the old ``--channels N``) counts
    them; UsageError when both say."""
    given = [x for x in (args.channels and "--channels A,B", args.num_channels is not None and "--num-channels N",
                         getattr(args, "channel_count", None) is not None and "--channels N") if x]
    if len(given) > 1:
        raise UsageError(f"give one of {' and '.join(given)}: --channels names the channels, --num-channels "
                         "counts them")
    if args.channels:
        return split_channels(args.channels)
    n = next((c for c in (args.num_channels, getattr(args, "channel_count", None)) if c is not None),
             DEFAULT_CHANNELS)
    if n < 1:
        raise UsageError(f"--num-channels must be >= 1, got {n}")
    return [f"{CHANNEL_PREFIX}{i}" for i in range(n)]


def _ns(**kw) -> SimpleNamespace:
    base = dict(config=None, master=None, option=[], format=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _table(path: Path):
    if not path.exists():
        return None
    return ds.dataset(str(path), format="parquet").to_table()


def _counts(table, col: str) -> dict[str, int]:
    if table is None or col not in table.column_names:
        return {}
    vc = table.column(col).value_counts()
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}


def _op_total(counts: dict[str, int], op: str) -> int:
    return sum(n for k, n in counts.items() if k.lower().startswith(op))


def _publish_ns(common: dict[str, str], args: argparse.Namespace, rows: int, start: int) -> argparse.Namespace:
    """Arguments of the publish job for ``rows`` synthetic rows from primary key ``start``, parsed by its own
    parser (every option it has keeps its default)."""
    from msgstream_spark.jobs import publish

    return publish.build_parser().parse_args([
        "--config", common["config"], "--channels", common["channels"], "--synthetic", str(rows),
        "--dim", str(args.dim), "--start", str(start), "--num-tasks", str(args.partitions),
        "--delete-fraction", str(args.delete_fraction), "--collection", "demo"])


def _expected(args: argparse.Namespace, step: int) -> dict[str, int]:
    """Row counts the demo must find: every insert, every step-th key deleted, the replay of round 2."""
    second = range(args.rows, args.rows + args.more_rows, step) if step else range(0)
    return {"events_insert": args.rows + args.more_rows,
            "events_delete": (len(range(0, args.rows, step)) + len(second)) if step else 0,
            "replay_insert": args.more_rows, "replay_delete": len(second)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from msgstream_spark.cli.commands import latest_position
    from msgstream_spark.config import Config
    from msgstream_spark.jobs import ingest, publish, replay
    from msgstream_spark.mq.registry import build_client

    channels = ",".join(channel_names(args))  # before anything is removed or written
    work = Path(args.workdir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cfg_path = work / "msgstream.yaml"
    cfg_path.write_text("mq:\n  type: local\nlocal:\n  path: msgstream.db\n")
    t_start = time.perf_counter()
    spark = spark_session("msgstream-demo", args.master)
    common = dict(config=str(cfg_path), channels=channels)
    step = max(1, int(round(1.0 / args.delete_fraction))) if args.delete_fraction > 0 else 0

    print(f"[1/7] publish {args.rows} rows ({args.dim}-dim vectors) to {channels}", flush=True)
    pub1 = publish.run(_publish_ns(common, args, args.rows, 0), spark)
    events, checkpoint = work / "lake" / "events", work / "lake" / "_events_checkpoint"
    print("[2/7] ingest with Trigger.AvailableNow into Parquet", flush=True)
    ing_args = _ns(**common, output=str(events), format="parquet", checkpoint=str(checkpoint),
                   subscription="demo-ingest", starting="earliest", trigger="available-now",
                   max_rows_per_trigger=None, dedupe=False, partition_by=None, timeout=None, progress_interval=5.0)
    ing1 = ingest.run(ing_args, spark)

    print("[3/7] save the channels' latest positions", flush=True)
    cfg = Config.load(cfg_path)
    with build_client(cfg.mq_type, cfg) as client:
        saved = [latest_position(client, ch) for ch in channels.split(",")]
    saved = [p for p in saved if p is not None]
    pos_file = work / "position.json"
    pos_file.write_text(json.dumps([p.to_json_dict() for p in saved]))

    print(f"[4/7] publish {args.more_rows} more rows", flush=True)
    pub2 = publish.run(_publish_ns(common, args, args.more_rows, args.rows), spark)

    print("[5/7] replay from the saved position; ingest again (incremental)", flush=True)
    replay_out = work / "lake" / "replay"
    rep = replay.run(_ns(**common, output=str(replay_out), format="parquet", mode="overwrite",
                         start="@" + str(pos_file), from_ts=None, end=None, to_ts=None, dedupe=False), spark)
    ing2 = ingest.run(ing_args, spark)

    print("[6/7] summary", flush=True)
    summary = _summary(args, step, work, t_start, saved, (pub1, pub2), (ing1, ing2), rep, (events, replay_out))
    _print_summary(summary)
    print(f"[7/7] mirror the collection into {_format().article} table", flush=True)
    summary["mirror"] = _mirror(args, common, work, step, spark)
    summary["got"]["mirror_equals_collection"] = summary["mirror"]["equal"]
    summary["expected"]["mirror_equals_collection"] = True
    if summary["got"] != summary["expected"]:
        raise MsgStreamError(f"demo check failed: expected {summary['expected']}, got {summary['got']}")
    return summary


def _collection_state(args, step: int, events: Path):
    """What the collection holds after the demo, from what it published: pk -> (category, score, vec).
    Keys and scalars from the synthetic generator minus the deleted keys; vectors (drawn per publish
    task) from the ingested change log, where each key is inserted once."""
    from msgstream_spark.cli.data import synthetic_batches

    ev = _table(events)
    ins = ev.filter(ev.column("op").cast("string").to_numpy(zero_copy_only=False) == "insert")
    vecs = dict(zip(ins.column("pk").to_pylist(), ins.column("vec").to_pylist()))
    state = {}
    for start, n in ((0, args.rows), (args.rows, args.more_rows)):
        deleted = set(range(start, start + n, step)) if step else set()
        for b in synthetic_batches(n, 1, start=start):
            for pk, cat, score in zip(*(b.column(i).to_pylist() for i in range(3))):
                if pk not in deleted:
                    state[pk] = (cat, score, vecs.get(pk))
    return state


def _format():
    """The format the demo mirrors into: the registry's default, as a user who gives no preference gets it."""
    from msgstream_spark.mirror.formats import registry

    return registry.get(registry.default())


def _mirror(args, common: dict[str, str], work: Path, step: int, spark) -> dict[str, Any]:
    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.table import open_table

    table = work / "lake" / "mirror"
    fmt = _format().name
    margs = mirror.build_parser().parse_args([
        "--config", common["config"], "--channels", common["channels"], "--collection", "demo",
        "--table", str(table), "--table-format", fmt, "--snapshot", "never"])
    t0 = time.perf_counter()
    res = mirror.run(margs, spark)
    secs = time.perf_counter() - t0
    got = open_table(fmt, str(table), collection="demo", pk="pk", create=False).to_arrow()
    rows = {r["pk"]: r for r in got.select(["pk", "category", "score", "vec", "_ts"]).to_pylist()}
    want = _collection_state(args, step, work / "lake" / "events")
    equal = rows.keys() == want.keys() and all(
        (rows[k]["category"], rows[k]["score"], rows[k]["vec"]) == v for k, v in want.items())
    print(f"\n== mirrored table {table} ({fmt}, {len(rows)} rows, {res['merged_batches']} merge(s), "
          f"{secs:.1f} s) next to what the collection holds ({len(want)} rows) ==")
    print(f"{'pk':>8}  {'table: category':>16} {'score':>6} {'_ts':>19}   {'collection: category':>20} {'score':>6}")
    for pk in list(range(0, 4)) + [args.rows - 1, args.rows]:
        t, c = rows.get(pk), want.get(pk)
        left = f"{t['category']:>16} {t['score']:>6.1f} {t['_ts']:>19}" if t else f"{'(deleted)':>16} {'':>6} {'':>19}"
        right = f"{c[0]:>20} {c[1]:>6.1f}" if c else f"{'(deleted)':>20}"
        print(f"{pk:>8}  {left}   {right}")
    print(f"mirror check: {'OK, equal row for row (vectors too)' if equal else 'FAILED'}\n", flush=True)
    return {"rows": len(rows), "collection_rows": len(want), "equal": equal, "seconds": round(secs, 1),
            "merged_batches": res["merged_batches"]}


def _summary(args, step, work, t_start, saved, pubs, ings, rep, outs) -> dict[str, Any]:
    """What the demo found against what it must find, and its throughput."""
    from msgstream_spark.cli.render import position_dict

    ev, rp = _table(outs[0]), _table(outs[1])
    ev_ops, rp_ops = _counts(ev, "op"), _counts(rp, "op")
    got = {"events_insert": _op_total(ev_ops, "insert"), "events_delete": _op_total(ev_ops, "delete"),
           "replay_insert": _op_total(rp_ops, "insert"), "replay_delete": _op_total(rp_ops, "delete")}
    return {
        "events": {"rows_per_op": ev_ops, "rows_per_channel": _counts(ev, "_channel")},
        "replay": {"rows_per_op": rp_ops, "rows_per_channel": _counts(rp, "_channel")},
        "saved_positions": [position_dict(p) for p in saved],
        "throughput_rows_per_second": {
            "publish": pubs[0].get("insert_rows_per_second"), "ingest": ings[0].get("rows_per_second"),
            "replay": rep.get("rows_per_second")},
        "ingest_runs": [ings[0]["rows"], ings[1]["rows"]],
        "publish": list(pubs),
        "expected": _expected(args, step), "got": got,
        "seconds": round(time.perf_counter() - t_start, 1),
        "workdir": str(work),
    }


def _print_summary(s: dict[str, Any]) -> None:
    print("\n== msgstream demo summary ==")
    for name in ("events", "replay"):
        print(f"{name:7s} rows per op: {s[name]['rows_per_op']}  per channel: {s[name]['rows_per_channel']}")
    for p in s["saved_positions"]:
        print(f"saved position {p['channel_name']}: msgID={p['msgID']} ts={p['timestamp']}")
    t = s["throughput_rows_per_second"]
    print(f"throughput rows/s: publish {t['publish']}, ingest {t['ingest']}, replay {t['replay']}")
    print(f"checks: {'OK' if s['got'] == s['expected'] else 'FAILED'} ({s['got']}); total {s['seconds']} s\n",
          flush=True)


def main(argv=None, prog: str | None = None) -> int:
    def quiet(args):  # the summary is already printed; no JSON dump
        run(args)

    return main_wrapper(build_parser(), quiet, argv, prog)


if __name__ == "__main__":
    raise SystemExit(main())
