"""The mirror job's ``--snapshot initial`` on Milvus writing to pulsar-lite (issue #20: the snapshot on a
cluster on Pulsar), with tests/milvus_real/test_mirror.py's driver on smaller collections (CI time). A
writer inserts, deletes and upserts through pymilvus during the snapshot and after it; a second run
resumes the stream from the checkpoint; each table (Delta and Iceberg) equals
``query(output_fields=["*"])`` row for row, vectors bit for bit."""

from __future__ import annotations

import pytest

from tests.milvus_real import test_mirror as mirror_tests
from tests.milvus_real.test_mirror import Plan, snapshot_while_writing

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

cfg = mirror_tests.cfg  # the job's config fixture: this directory's milvus_stack gives it mq.type pulsar


def test_snapshot_while_writing_then_stream_equals_query(spark, milvus_stack, pymilvus_orm, cfg, tmp_path):
    assert milvus_stack.mq == "pulsar"
    plans = [Plan("pmir_d", 400, "delta", ("--snapshot-tasks", "2")), Plan("pmir_i", 200, "iceberg")]
    summaries = snapshot_while_writing(spark, milvus_stack, pymilvus_orm, cfg, tmp_path, plans)
    assert 2 <= summaries["pmir_d"]["snapshot"]["ranges"] <= 3  # about one range per task; each partition gets one
