"""``--snapshot-source storage`` on Milvus writing to pulsar-lite: the checkpoints in etcd hold Pulsar message
ids, and the stream resumes from them (tests/milvus_real/test_mirror_storage.py's driver, unchanged)."""

from __future__ import annotations

import pytest

from tests.milvus_real import test_mirror_storage as storage_tests

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]

scfg = storage_tests.scfg  # this directory's milvus_stack gives it mq.type pulsar


def test_storage_snapshot_while_writing_then_stream_equals_query(spark, milvus_stack, pymilvus_orm, scfg, tmp_path):
    assert milvus_stack.mq == "pulsar"
    storage_tests.storage_snapshot_while_writing(spark, milvus_stack, pymilvus_orm, scfg, tmp_path)  # a local table
