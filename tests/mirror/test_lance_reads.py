"""What a Lance batch reads of the table's metadata on S3: a version's manifest (which lists every fragment: it
grows with the table) once, not at each of the batch's steps (before: every step opened the dataset anew and
the exactly-once check read the newest version's transaction: 15 manifest GETs a batch), while a version
another writer committed is still seen. Counted on the S3 server's own request log."""

from __future__ import annotations

import re

from msgstream_spark.mirror import apply_batch, open_table
from tests.mirror.changes import FIELDS, insert, model, table_state, to_arrow, upsert


def _lines(s3) -> int:
    return len(s3.server.log.read_text(errors="replace").splitlines())


def _manifest_gets(s3, start: int) -> list[str]:
    lines = s3.server.log.read_text(errors="replace").splitlines()[start:]
    return [ln for ln in lines if re.search(rf"GET /{s3.bucket}/[^ ]*/_versions/[^ ?]*\.manifest", ln)]


def test_a_batch_reads_each_manifest_once(s3):
    t = open_table("lance", s3.uri("lake", "t"), collection="coll", pk="pk", arrow_schema=FIELDS,
                   storage_options=s3.options())
    seen = [insert(10, *[(p, f"a{p}") for p in range(40)])]
    assert apply_batch(t, to_arrow(seen[0:1]), "pk", "q", 0)
    counts = []
    for i in range(1, 4):
        batch = [*upsert(10 + 10 * i, *[(p, f"u{i}.{p}") for p in range(i, 40, 4)]),
                 insert(11 + 10 * i, (100 + i, "n"))]
        start = _lines(s3)
        assert apply_batch(t, to_arrow(batch), "pk", "q", i)
        counts.append(len(_manifest_gets(s3, start)))
        seen += batch
    assert table_state(t.to_arrow()) == model(seen)
    # at most one (the handle knows the version the batch starts from: its own last commit's, which came back
    # from the commit with its record); before: 15 a batch, each step opening the dataset and reading the record
    assert max(counts) <= 1, counts

    other = open_table("lance", s3.uri("lake", "t"), collection="coll", pk="pk", arrow_schema=FIELDS,
                       storage_options=s3.options())  # another writer's batch: the first handle sees it
    assert apply_batch(other, to_arrow(upsert(500, (1, "x"))), "pk", "q", 4)
    assert t.last_batch("q") == 4
    assert not apply_batch(t, to_arrow(upsert(500, (1, "x"))), "pk", "q", 4)
