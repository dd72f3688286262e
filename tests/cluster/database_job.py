"""The database job (``mirror run --database``) on the cluster with a snapshot held beside the stream: its pending
collection's batches staged on the store (tests/cluster/test_cluster_jobs.py's
``test_the_database_job_stages_on_the_store_on_the_cluster``).

As tests/mirror_job/test_mirror_many_staging.py's in-process test: db1.a and db1.b are in Milvus (the suite's
proxy, tests/milvus_proxy) when the job starts; b's snapshot is held at its first Query (the proxy's ``on_query``
hook, in this process) while the test writes b's changes after its S and a row of a's: a's table must take it in
a batch and b's batches be staged (``staged.json`` and the files it lists, objects on the store) before the hold
ends. The job runs on the cluster (a step of the module's application); the test ends its processing-time query
once b's table holds every row (the app's ``stop`` step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests.fixtures.waits import wait_until
from tests.mirror_job.many_log import ManyLog, listed_collections
from tests.mirror_job.test_mirror_many_beside import HOLD

A, B = ("db1", "a", 61), ("db1", "b", 62)


@dataclass
class Staged:
    """What the hold saw on the store: every ``staged.json`` of b's batches and, per file it lists, its size."""

    marks: dict[str, dict] = field(default_factory=dict)  # key -> the mark's content
    files: dict[str, int | None] = field(default_factory=dict)  # key of a listed file -> its size (None: absent)


def staged_on_the_store(s3, prefix: str) -> Staged:
    """The marks under ``prefix`` (``<staging>/<collection id>/``) and the objects of the files each lists."""
    b3, got = s3.server.boto3(), Staged()
    objs = {o["Key"]: o["Size"] for page in b3.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                                                          Prefix=prefix)
            for o in page.get("Contents", [])}
    for key in [k for k in objs if k.endswith("/staged.json")]:
        mark = json.loads(b3.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        got.marks[key] = mark
        batch = key.rsplit("/", 1)[0]
        for name in mark.get("files", []):
            got.files[f"{batch}/{name}"] = objs.get(f"{batch}/{name}")
    return got


def held_snapshot_run(app, lake, log: ManyLog, state, argv: list[str], seen: dict) -> dict:
    """Run the job (a step of ``app``) with b's snapshot held until b's batches are staged on the store (their
    marks and listed files, ``seen["staged"]``) and a's row 100 is in a's table; then rows of b after its
    snapshot, until b's table holds them all; then its query is stopped. Returns the job's summary."""
    staging_prefix = f"staging/{B[2]}/"

    def hold(request) -> None:  # b's first Query: its S taken; b's changes now come after it
        if request.collection_name != "b" or "held" in seen:
            return
        seen["held"] = True
        log.insert(B[2], [100, 101])
        log.delete(B[2], [0])
        log.upsert(B[2], [5], gen=1)
        log.insert(A[2], [100])
        log.tick()

        def staged() -> bool:
            got = staged_on_the_store(lake.s3, staging_prefix)
            seen["staged"] = got
            return bool(got.marks) and any(m.get("files") for m in got.marks.values())

        try:
            wait_until(staged, HOLD, "b's batches staged on the store", seen=lambda: seen.get("staged"))
            wait_until(lambda: 100 in lake.rows("db1", "a"), HOLD, "a's row 100 in a's table")
        except AssertionError as exc:
            seen["error"] = exc
        seen["done"] = True

    state.on_query = hold
    index = app.mirror(*argv)
    try:
        wait_until(lambda: "done" in seen, 6 * HOLD, "b's snapshot held", alive=app.running)
        wait_until(lambda: lake.keys("db1", "b", "_delta_log/"), HOLD, "b's snapshot committed", alive=app.running)
        log.insert(B[2], [300])  # the first batch after b's snapshot: its handover, then these rows
        log.delete(B[2], [3])
        log.tick()
        wait_until(lambda: lake.rows("db1", "b") == log.expected[B], 2 * HOLD, "b's table equal to its rows",
                   alive=app.running)
    finally:
        state.on_query = None
        app.stop_streams()
        done = app.wait(index)
    assert done.returncode == 0, app.failure()
    return json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("SUMMARY "))[len("SUMMARY "):])


def start_collections(log: ManyLog, state, chans: list[str]) -> None:
    """db1.a and db1.b created, listed in the proxy, ten rows each."""
    listed_collections(log, state, A, B)
    log.insert(A[2], range(10))
    log.insert(B[2], range(10))
    log.tick()
