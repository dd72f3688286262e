"""The storage snapshot's metadata decoding and plan rules, on protobuf bytes the protobuf library encodes.

``datapb`` is not among pymilvus's generated modules: the messages are declared here with the field numbers
of milvus-io/milvus ``internal/proto/data_coord.proto`` (SegmentInfo, FieldBinlog, Binlog) and encoded by
the official protobuf runtime, then decoded by the product's wire reader.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from msgstream_spark.errors import ConfigError, MirrorError
from msgstream_spark.mirror.snapshot.storage.access import StorageSettings, storage_settings
from msgstream_spark.mirror.snapshot.storage.etcdmeta import FLUSHED, CollectionMeta, field_binlog, segment_info
from msgstream_spark.mirror.snapshot.storage.plan import build_plan
from msgstream_spark.msg.pb import msg_pb2

F = descriptor_pb2.FieldDescriptorProto


def _classes():
    fdp = descriptor_pb2.FileDescriptorProto(name="test_datapb.proto", package="testdatapb", syntax="proto3")
    specs = {
        "Binlog": [("entries_num", 1, F.TYPE_INT64, None), ("timestamp_from", 2, F.TYPE_UINT64, None),
                   ("timestamp_to", 3, F.TYPE_UINT64, None), ("log_path", 4, F.TYPE_STRING, None),
                   ("log_size", 5, F.TYPE_INT64, None), ("logID", 6, F.TYPE_INT64, None)],
        "FieldBinlog": [("fieldID", 1, F.TYPE_INT64, None), ("binlogs", 2, F.TYPE_MESSAGE, ".testdatapb.Binlog")],
        "Pos": [("channel_name", 1, F.TYPE_STRING, None), ("msgID", 2, F.TYPE_BYTES, None),
                ("timestamp", 4, F.TYPE_UINT64, None)],
        "SegmentInfo": [("ID", 1, F.TYPE_INT64, None), ("collectionID", 2, F.TYPE_INT64, None),
                        ("partitionID", 3, F.TYPE_INT64, None), ("insert_channel", 4, F.TYPE_STRING, None),
                        ("num_of_rows", 5, F.TYPE_INT64, None), ("state", 6, F.TYPE_INT32, None),
                        ("dml_position", 10, F.TYPE_MESSAGE, ".testdatapb.Pos"),
                        ("binlogs", 11, F.TYPE_MESSAGE, ".testdatapb.FieldBinlog"),
                        ("deltalogs", 13, F.TYPE_MESSAGE, ".testdatapb.FieldBinlog"),
                        ("compacted", 19, F.TYPE_BOOL, None), ("level", 20, F.TYPE_INT32, None),
                        ("storage_version", 21, F.TYPE_INT64, None)],
    }
    for name, fields in specs.items():
        m = fdp.message_type.add(name=name)
        for fname, num, typ, tname in fields:
            rep = F.LABEL_REPEATED if fname in ("binlogs", "deltalogs") else F.LABEL_OPTIONAL
            f = m.field.add(name=fname, number=num, type=typ, label=rep)
            if tname:
                f.type_name = tname
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"testdatapb.{n}")) for n in specs}


C = _classes()


def _segment(sid: int, channel: str, version: int = 0, compacted: bool = False, state: int = FLUSHED) -> bytes:
    logs = [C["FieldBinlog"](fieldID=fid, binlogs=[C["Binlog"](entries_num=10, timestamp_from=5, timestamp_to=9,
                                                             logID=1000 + fid)]) for fid in (0, 1, 100, 101)]
    return C["SegmentInfo"](ID=sid, collectionID=7, partitionID=8, insert_channel=channel, num_of_rows=10,
                            state=state, dml_position=C["Pos"](channel_name=channel, timestamp=99), binlogs=logs,
                            deltalogs=[C["FieldBinlog"](binlogs=[C["Binlog"](entries_num=2, logID=77)])],
                            compacted=compacted, storage_version=version).SerializeToString()


def _meta(*segs: bytes) -> CollectionMeta:
    cp = msg_pb2.MsgPosition(channel_name="dml_0_7v0", msgID=b"\x01" + b"\0" * 7, timestamp=500)
    from msgstream_spark.msg.position import MsgPosition

    return CollectionMeta(3, [segment_info(s) for s in segs], {"dml_0_7v0": MsgPosition.from_proto_bytes(
        cp.SerializeToString())})


def test_segment_info_and_field_binlog_decode():
    s = segment_info(_segment(-5 & 0xFFFF, "dml_0_7v0"))
    assert (s.id, s.collection_id, s.partition_id, s.channel, s.rows, s.state, s.dml_ts) == \
        (0xFFFB, 7, 8, "dml_0_7v0", 10, FLUSHED, 99)
    assert sorted(s.binlogs) == [0, 1, 100, 101] and s.binlogs[101][0].log_id == 1101
    assert [d.log_id for d in s.deltalogs] == [77]
    fid, logs = field_binlog(C["FieldBinlog"](fieldID=-1, binlogs=[C["Binlog"](log_path="a/b")]).SerializeToString())
    assert fid == -1 and logs[0].path == "a/b" and logs[0].log_id == 0


def test_plan_paths_tasks_and_the_rules_for_compacted_segments():
    plan = build_plan(_meta(_segment(1, "dml_0_7v0"), _segment(2, "dml_0_7v0", compacted=True)), 7, [100, 101])
    assert plan.segments == [1] and plan.snapshot_ts == 500 and plan.rows == 10
    assert dict(plan.tasks[0].files)[101] == "insert_log/7/8/1/101/1101"
    assert plan.deltas == [(1, 500, "delta_log/7/8/1/77")]
    pos = plan.starting_positions(["dml_0", "dml_1"])
    assert pos["dml_1"] == "latest" and pos["dml_0"] != "latest"


def test_an_unknown_storage_version_is_refused_naming_the_query_route():
    with pytest.raises(MirrorError, match="storage version 2.*--snapshot-source query"):
        build_plan(_meta(_segment(1, "dml_0_7v0", version=2)), 7, [100, 101])


def test_storage_settings_from_milvus_yaml_keys_and_the_secret_masked():
    from msgstream_spark.config.loader import Config

    s = storage_settings(Config.load(None, overrides={"common.storageType": "minio", "minio.address": "h",
                                                      "minio.port": 9000, "minio.bucketName": "b",
                                                      "minio.rootPath": "files", "minio.accessKeyID": "ak",
                                                      "minio.secretAccessKey": "sekrit"}))
    assert (s.kind, s.location, s.options["aws_endpoint"]) == ("s3", "s3://b/files", "http://h:9000")
    assert s.options["aws_allow_http"] == "true" and s.options["aws_secret_access_key"] == "sekrit"
    assert "sekrit" not in repr(s) and "sekrit" not in str(s)
    assert s.path("insert_log/1") == "s3://b/files/insert_log/1"
    with pytest.raises(ConfigError, match="localStorage.path"):
        storage_settings(Config.load(None, overrides={"common.storageType": "local"}))
    assert StorageSettings("/x").path("a") == "/x/a"
