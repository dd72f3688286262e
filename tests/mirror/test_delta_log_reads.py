"""What a Delta batch reads of the table's log on S3: the exactly-once check (``last_batch``) reads the commits
since the last read, not every commit since the last checkpoint (delta-rs's ``transaction_version`` replays them
all on each call: on S3 a GET per commit, twice per batch, each commit as large as the files a batch touched),
and it sees a batch another writer committed meanwhile; the deletion vectors a commit wrote are not read back by
the next batch (one ranged GET per touched file, one after another), while another writer's are read and right.
Counted on the S3 server's own request log."""

from __future__ import annotations

import re

from msgstream_spark.mirror import apply_batch, open_table
from tests.mirror.changes import FIELDS, insert, to_arrow, upsert


def _log_gets(s3, start: int, what: str = "_delta_log/") -> list[str]:
    """The GETs of the table's objects under ``what`` the server logged after line ``start``."""
    lines = s3.server.log.read_text(errors="replace").splitlines()[start:]
    return [ln for ln in lines if re.search(rf"GET /{s3.bucket}/[^ ]*/{what}", ln)]


def _lines(s3) -> int:
    return len(s3.server.log.read_text(errors="replace").splitlines())


def _open(s3):
    return open_table("delta", s3.uri("lake", "t"), collection="coll", pk="pk", arrow_schema=FIELDS,
                      storage_options=s3.options())


def test_the_exactly_once_check_reads_only_new_commits_and_sees_another_writers(s3):
    t = _open(s3)
    assert apply_batch(t, to_arrow([insert(10, *[(p, f"a{p}") for p in range(40)])]), "pk", "q", 0)
    for i in range(1, 12):
        assert apply_batch(t, to_arrow(upsert(10 + 10 * i, *[(p, f"u{i}.{p}") for p in range(i % 4, 40, 4)])),
                           "pk", "q", i)
    start = _lines(s3)
    assert t.last_batch("q") == 11
    assert t.last_batch("other") is None
    gets = _log_gets(s3, start)
    # the one commit the log state had not read yet (this handle's last) and a probe for the next version; the
    # replay read all 12 commits
    assert len(gets) <= 3, gets

    other = _open(s3)  # another writer commits batch 12 of the query; the first handle's check sees it
    assert apply_batch(other, to_arrow(upsert(500, (1, "x"))), "pk", "q", 12)
    assert t.last_batch("q") == 12
    assert not apply_batch(t, to_arrow(upsert(500, (1, "x"))), "pk", "q", 12)


def test_a_batch_reads_back_no_deletion_vector_its_writer_committed(s3):
    from tests.mirror.changes import delete

    t = _open(s3)
    for i in range(4):  # each batch deletes keys of all the files before it: a vector per touched file
        gone = [delete(15 + 10 * i, *range(0, 10 * i, 3))] if i else []
        assert apply_batch(t, to_arrow([insert(10 + 10 * i, *[(p, f"a{p}") for p in range(10 * i, 10 * i + 10)]),
                                        *gone]), "pk", "q", i)
    start = _lines(s3)
    live = t.live_files()
    assert _log_gets(s3, start, "deletion_vector_") == []
    other = _open(s3)  # another writer's handle reads the vectors, and finds what the first one knows
    theirs = {f.path: list(f.deleted) for f in other.live_files()}
    assert theirs == {f.path: list(f.deleted) for f in live}
    assert sum(len(v) for v in theirs.values()) == len(range(0, 30, 3))
    assert _log_gets(s3, start, "deletion_vector_")


def test_the_next_batch_reads_back_no_commit_its_writer_published(s3):
    t = _open(s3)  # version 0: the table's creation; batches 0-3: versions 1-4
    for i in range(4):
        assert apply_batch(t, to_arrow(upsert(10 + 10 * i, *[(p, f"a{i}.{p}") for p in range(i, 40, 2)])),
                           "pk", "q", i)
    start = _lines(s3)
    assert t.last_batch("q") == 3
    live = t.live_files()
    # only the probe for version 5 (absent); reading back version 4 cost a GET of a commit per batch
    assert not [g for g in _log_gets(s3, start) if re.search(r"0000000[0-4]\.json", g)], _log_gets(s3, start)
    other = _open(s3)  # a handle reading the whole log finds the same files, deletion vectors and batch
    assert other.last_batch("q") == 3
    assert {f.path: list(f.deleted) for f in other.live_files()} == {f.path: list(f.deleted) for f in live}
    assert apply_batch(other, to_arrow(upsert(100, (1, "x"))), "pk", "q", 4)  # and the first handle sees it
    assert t.last_batch("q") == 4
