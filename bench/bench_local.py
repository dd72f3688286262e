"""Embedded log throughput: batched produce and consume through the backend SPI.

Baseline, measured in the same run: raw sqlite3 ``executemany`` insert and a plain
``SELECT`` of the same payloads into a table of the same shape (WAL mode).
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from pathlib import Path

from bench._util import table
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.local.client import LocalClient

MESSAGES, BATCH = 20_000, 500
SIZES = {"small (200 B)": 200, "insert-sized (64 KiB)": 64 * 1024}


def _raw(path: str, payloads: list[bytes]) -> tuple[float, float]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE m (channel TEXT, id INTEGER, ts INTEGER, append_ms INTEGER, props TEXT, payload BLOB,"
               " PRIMARY KEY (channel, id))")
    t0 = time.perf_counter()
    for s in range(0, len(payloads), BATCH):
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO m VALUES ('c', ?, 0, 0, '{}', ?)",
                       [(s + i, p) for i, p in enumerate(payloads[s:s + BATCH])])
        db.execute("COMMIT")
    t_prod = time.perf_counter() - t0
    t0 = time.perf_counter()
    last = -1
    while True:
        rows = db.execute("SELECT id, payload FROM m WHERE channel = 'c' AND id > ? ORDER BY id LIMIT 1024",
                          (last,)).fetchall()
        if not rows:
            break
        last = rows[-1][0]
    t_cons = time.perf_counter() - t0
    db.close()
    return t_prod, t_cons


def _ours(path: str, payloads: list[bytes]) -> tuple[float, float, float]:
    c = LocalClient(Config.from_dict({"mq": {"type": "local"}, "local": {"path": path}}))
    p = c.create_producer("c")
    msgs = [ProducerMessage(x, {"msg_type": "Insert"}) for x in payloads]
    t0 = time.perf_counter()
    for s in range(0, len(msgs), BATCH):
        p.send_batch(msgs[s:s + BATCH])
    t_prod = time.perf_counter() - t0
    t_cons = _consume(c, len(msgs), bulk=False)
    t_raw = _consume(c, len(msgs), bulk=True)
    p.close()
    c.close()
    return t_prod, t_cons, t_raw


def _consume(c: LocalClient, count: int, bulk: bool) -> float:
    """Seconds to read the channel through receive_batch (Message objects) or the bulk receive_raw."""
    cons = c.subscribe("c", f"bench-{int(bulk)}", SubscriptionInitialPosition.EARLIEST)
    t0 = time.perf_counter()
    n = 0
    while n < count:
        n += len(cons.receive_raw(1024, 1.0) if bulk else cons.receive_batch(1024, 1.0))
    t = time.perf_counter() - t0
    cons.close()
    return t


def run() -> dict:
    res: dict = {}
    lines = []
    with tempfile.TemporaryDirectory() as d:
        for label, size in SIZES.items():
            n = MESSAGES if size < 4096 else MESSAGES // 10
            payloads = [bytes([i % 251]) * size for i in range(n)]
            rp, rc = _raw(str(Path(d) / f"raw{size}.db"), payloads)
            op, oc, ob = _ours(str(Path(d) / f"ours{size}.db"), payloads)
            res[label] = {"messages": n, "produce_msgs_s": n / op, "consume_msgs_s": n / oc,
                          "raw_insert_msgs_s": n / rp, "raw_select_msgs_s": n / rc,
                          "produce_ratio": rp / op, "consume_ratio": rc / oc, "consume_raw_msgs_s": n / ob,
                          "consume_raw_ratio": rc / ob}
            lines += [(f"{label}: raw sqlite insert", n / rp, None),
                      (f"{label}: produce (send_batch)", n / op, rp / op),
                      (f"{label}: raw sqlite select", n / rc, None),
                      (f"{label}: consume (receive_batch)", n / oc, rc / oc),
                      (f"{label}: consume (bulk receive_raw)", n / ob, rc / ob)]
    print(table(lines, unit="msgs/s"))
    return res


if __name__ == "__main__":
    run()
