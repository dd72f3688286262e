"""What a Lance batch reads of the table's metadata on S3: a version's manifest (which lists every fragment: it
grows with the table) once, not at each of the batch's steps (before: every step opened the dataset anew and
the exactly-once check read the newest version's transaction: 15 manifest GETs a batch), while a version
another writer committed is still seen. Counted on the S3 server's own request log."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.mirror import apply_batch, open_table, snapshot_seq_array
from tests.mirror.changes import FIELDS, insert, model, table_state, to_arrow, upsert, vector


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


def _snapshot(loc: Path, rows: int, files: int) -> list[str]:
    """A snapshot's ``rows`` keys 0..rows-1 at S=100 in ``files`` Parquet files of the table's columns."""
    per = rows // files
    out = []
    for i in range(files):
        pks = list(range(i * per, (i + 1) * per))
        t = pa.table({"pk": pa.array(pks, pa.int64()), "v": [f"s{p}" for p in pks],
                      "fv": pa.array([vector(f"s{p}") for p in pks], pa.list_(pa.float32())),
                      "_ts": pa.array([100] * per, pa.int64()), "_seq": snapshot_seq_array(100, per),
                      "_partition": pa.array([7] * per, pa.int64())})
        out.append(str(loc / "snapshot-1" / f"part-{i}.parquet"))
        os.makedirs(os.path.dirname(out[-1]), exist_ok=True)
        pq.write_table(t, out[-1])
    return out


def _deletion_files(loc: Path) -> set[str]:
    return {p.name for p in (loc / "_deletions").glob("*")} if (loc / "_deletions").exists() else set()


@pytest.mark.parametrize("scale", [1, 8])
def test_a_batchs_deletion_files_are_one_per_fragment_of_the_target_size_not_one_per_snapshot_file(tmp_path, scale):
    """A snapshot's files are packed into fragments of up to ``fragment_rows`` rows, so a batch changing keys all
    over the table rewrites (Lance: one deletion file per fragment, the old one read, a new one written) as many
    deletion files as the table has rows / ``fragment_rows``, not one per snapshot file: at 1x and 8x the rows in
    files of 25 rows, 1 and 8 fragments, 1 and 8 deletion files a batch (before: 16 and 128 of each)."""
    loc = tmp_path / "t"
    t = open_table("lance", str(loc), collection="coll", pk="pk", arrow_schema=FIELDS, create=False)
    t.fragment_rows = 400  # (1 << 20 by default, Lance's own max_rows_per_file: 25 rows a file stands for 64k)
    rows = 400 * scale
    t.add_files(_snapshot(loc, rows, 16 * scale), properties={"msgstream.snapshot_ts": "100"})
    assert len(t.live_files()) == scale
    seen = [insert(100, *[(p, f"s{p}") for p in range(rows)])]
    for i in range(2):
        before = _deletion_files(loc)
        batch = [*upsert(200 + i, *[(p, f"u{i}.{p}") for p in range(i, rows, 13)])]
        assert apply_batch(t, to_arrow(batch), "pk", "q", i)
        seen += batch
        assert len(_deletion_files(loc) - before) == scale  # one per fragment the batch's keys are in
    assert table_state(t.to_arrow()) == model(seen)
