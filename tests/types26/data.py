"""Milvus 2.6 / 3.0 field types with data this project did not write (shared/docs/milvus-26-types.md §12).

- Client form: pymilvus's own ``Prepare.row_insert_param``, given the schema dict pymilvus itself builds
  from a DescribeCollection response (``pymilvus.client.abstract.CollectionSchema(...).dict()``).
- WAL form: the proxy's conversions, applied here to that client form as the cited functions do
  (internal/proxy/validate_util.go, util.go), never with the product's encoder:
  ``checkGeometryFieldData`` (geometry_wkt_data -> geometry_data, ``ConvertWKTToWKB`` = go-geom NDR ISO
  WKB; shapely writes the same bytes), ``checkTimestamptzFieldData`` (string_data -> timestamptz_data,
  ``ParseTimeTz`` in the collection's zone, default UTC, -> ``UnixMicro``), ``checkAndFlattenStructFieldData``
  (a struct -> top-level ``struct[sub]`` columns with the sub-fields' ids), ``fillFieldPropertiesOnly``
  (field_id, element_type from the schema) and ``FillWithNullValue`` (nullable scalars expanded with zero
  values; vectors compact).
- Envelopes: msgpb protobufs for the 2.5 InsertRequest / CreateCollectionRequest with the ``msg_type``
  property, and ``tests.wal26.producer`` for the 2.6 properties and headers.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import shapely
from pymilvus.client.abstract import CollectionSchema as ClientSchema
from pymilvus.client.prepare import Prepare

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2
from tests.wal26 import producer as P

DT = schema_pb2.DataType
UTC = dt.timezone.utc
COLLECTION, PARTITION, SEGMENT = P.COLLECTION, P.PARTITION, P.SEGMENT
NAME = "types26"
TT = P.tt_of(1_767_225_600_000)  # 2026-01-01


def _field(s, fid: int, name: str, t: int, params: dict | None = None, **kw) -> None:
    f = s.fields.add(fieldID=fid, name=name, data_type=t, **kw)
    for k, v in (params or {}).items():
        f.type_params.add(key=k, value=str(v))


def _sub(st, fid: int, sub: str, t: int, elem: int, params: dict, *, stored_names: bool) -> None:
    f = st.fields.add(fieldID=fid, name=f"{st.name}[{sub}]" if stored_names else sub, data_type=t, element_type=elem,
                      nullable=st.nullable)
    for k, v in {**params, "max_capacity": 8}.items():
        f.type_params.add(key=k, value=str(v))


def collection_schema(*, stored_names: bool = True, with_note: bool = False, system_fields: bool = True,
                      nullable_marks: bool = False) -> Any:
    """The schema as Milvus keeps and broadcasts it: ids from 100, fields first, then each struct and its
    sub-fields (rootcoord ``assignFieldAndFunctionID``), sub-fields named ``struct[sub]`` from 2.6.4
    (``transformStructFieldNames``), system fields appended; a BM25 function output (``sparse``)."""
    s = schema_pb2.CollectionSchema(name=NAME)
    _field(s, 100, "id", DT.Int64, is_primary_key=True)
    _field(s, 101, "vec", DT.FloatVector, {"dim": 4})
    _field(s, 102, "title", DT.Text, nullable=True, params={"enable_analyzer": "true"})
    _field(s, 103, "shape", DT.Geometry, nullable=True)
    _field(s, 104, "at", DT.Timestamptz, nullable=True)
    _field(s, 105, "i8v", DT.Int8Vector, {"dim": 4})
    _field(s, 106, "nvec", DT.FloatVector, {"dim": 2}, nullable=True)
    _field(s, 107, "sparse", DT.SparseFloatVector, is_function_output=True)
    s.functions.add(name="bm25", type=schema_pb2.FunctionType.BM25, input_field_names=["title"],
                    input_field_ids=[102], output_field_names=["sparse"], output_field_ids=[107])
    clips = s.struct_array_fields.add(fieldID=108, name="clips")
    _sub(clips, 109, "frame_ids", DT.Array, DT.Int64, {}, stored_names=stored_names)
    _sub(clips, 110, "emb", DT.ArrayOfVector, DT.FloatVector, {"dim": 2}, stored_names=stored_names)
    marks = s.struct_array_fields.add(fieldID=111, name="marks", nullable=nullable_marks)  # nullable: 3.0
    _sub(marks, 112, "label", DT.Array, DT.VarChar, {"max_length": 16}, stored_names=stored_names)
    _sub(marks, 113, "bits", DT.ArrayOfVector, DT.BinaryVector, {"dim": 16}, stored_names=stored_names)
    _sub(marks, 114, "q", DT.ArrayOfVector, DT.Int8Vector, {"dim": 3}, stored_names=stored_names)
    if with_note:  # AlterCollection add-field: id = max + 1
        _field(s, 115, "note", DT.VarChar, {"max_length": 64}, nullable=True)
    if system_fields:  # createCollectionTask.appendSysFields (DescribeCollection leaves them out)
        _field(s, 0, "RowID", DT.Int64)
        _field(s, 1, "Timestamp", DT.Int64)
    return s


def _i8(*v) -> np.ndarray:
    return np.array(v, dtype=np.int8)


# Rows as a user inserts them with pymilvus (time zones and DST edges; None = null).
TIMES = ["2025-03-30T01:30:00+01:00",  # Europe/Paris, 30 min before the spring-forward gap
         "2024-11-03T01:30:00-05:00",  # US Eastern, the repeated hour after fall-back (second pass, EST)
         "2025-05-01 12:00:00",  # naive: read in the collection's zone (UTC)
         None,
         "2025-05-01T23:59:59.123456+08:00"]
WKT = ["POINT (1 2)", "LINESTRING (0 0, 1 1, 2 3)", None, "POLYGON ((0 0, 4 0, 4 4, 0 4, 0 0), (1 1, 2 1, 2 2, 1 1))",
       "MULTIPOINT Z ((1 2 3), (4 5 6))"]
ROWS: list[dict] = [
    {"id": 1, "vec": [0.1, 0.2, 0.3, 0.4], "title": "hello world", "shape": WKT[0], "at": TIMES[0],
     "i8v": _i8(1, -2, 3, -4), "nvec": [0.5, 0.25],
     "clips": [{"frame_ids": 7, "emb": [0.1, 0.2]}, {"frame_ids": 8, "emb": [0.3, 0.4]}],
     "marks": [{"label": "a", "bits": b"\x01\x02", "q": _i8(1, 2, 3)}]},
    {"id": 2, "vec": [1.0, 2.0, 3.0, 4.0], "title": None, "shape": WKT[1], "at": TIMES[1], "i8v": _i8(0, 0, 0, 127),
     "nvec": None, "clips": [{"frame_ids": 9, "emb": [0.5, 0.6]}],
     "marks": [{"label": "b", "bits": b"\xff\x00", "q": _i8(-128, 0, 127)},
               {"label": "c", "bits": b"\x0f\xf0", "q": _i8(4, 5, 6)}]},
    {"id": 3, "vec": [-1.0, 0.0, 1.0, 2.5], "title": "", "shape": WKT[2], "at": TIMES[2], "i8v": _i8(5, 6, 7, 8),
     "nvec": None, "clips": [], "marks": [{"label": "d", "bits": b"\x00\x00", "q": _i8(0, 0, 0)}]},
    {"id": 4, "vec": [3.0, 3.0, 3.0, 3.0], "title": "ünïcode ✓", "shape": WKT[3], "at": TIMES[3],
     "i8v": _i8(-1, -1, -1, -1), "nvec": [1.5, -2.0],
     "clips": [{"frame_ids": 1, "emb": [1.0, 2.0]}, {"frame_ids": 2, "emb": [3.0, 4.0]},
               {"frame_ids": 3, "emb": [5.0, 6.0]}], "marks": []},
    {"id": 5, "vec": [9.0, 8.0, 7.0, 6.0], "title": "last", "shape": WKT[4], "at": TIMES[4],
     "i8v": _i8(10, 20, 30, 40), "nvec": [0.0, 1.0], "clips": [{"frame_ids": 4, "emb": [7.0, 8.0]}],
     "marks": [{"label": "e", "bits": b"\xaa\x55", "q": _i8(9, 8, 7)}]},
]


def client_request(rows: list[dict] = ROWS, schema: Any = None) -> Any:
    """The milvuspb.InsertRequest pymilvus 3.0.2 sends for ``rows`` (its own encoder, its own schema dict)."""
    from pymilvus.grpc_gen import milvus_pb2

    desc = ClientSchema(milvus_pb2.DescribeCollectionResponse(schema=schema or collection_schema(system_fields=False),
                                                             collectionID=COLLECTION)).dict()
    return Prepare.row_insert_param(NAME, rows, "", desc["fields"], desc.get("struct_array_fields"))


# -- the proxy's conversions (client form -> WAL form) -----------------------------------------------------
def wkt_to_wkb(wkt: str) -> bytes:
    """go-geom ``wkb.Marshal(g, wkb.NDR)``: ISO WKB, little-endian, no SRID (shapely writes the same)."""
    g = shapely.from_wkt(wkt)
    return shapely.to_wkb(g, byte_order=1, flavor="iso", include_srid=False,
                          output_dimension=3 if shapely.has_z(g) else 2)


def parse_time_tz(s: str, zone: dt.tzinfo = UTC) -> int:
    """``timestamptz.ParseTimeTz`` (offset honoured, naive read in the collection zone) -> ``UnixMicro``."""
    t = dt.datetime.fromisoformat(s)
    if t.tzinfo is None:
        t = t.replace(tzinfo=zone)
    delta = t - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _expand(valid: list[bool], values: list, zero: Any) -> list:
    """FillWithNullValue: the client sent only the valid rows; the zero value goes at each null row."""
    it = iter(values)
    return [next(it) if v else zero for v in valid]


def _expand_struct_rows(flat: Any) -> None:
    """FillWithNullValue on a nullable struct's sub-field (3.0): the client sent the valid rows only; a null
    row becomes an empty ScalarField (Array) or an empty VectorField with dim set (``fillVectorArrayNullValueImpl``)."""
    valid = list(flat.valid_data)
    if flat.type == DT.Array:
        rows = list(flat.scalars.array_data.data)
        del flat.scalars.array_data.data[:]
        for row in _expand(valid, rows, schema_pb2.ScalarField()):
            flat.scalars.array_data.data.add().CopyFrom(row)
    else:
        va = flat.vectors.vector_array
        rows = list(va.data)
        del va.data[:]
        for row in _expand(valid, rows, schema_pb2.VectorField(dim=va.dim)):
            va.data.add().CopyFrom(row)


def to_wal_form(client: Any, schema: Any, *, stored_names: bool = True, compact_structs: bool = False) -> list[Any]:
    """The FieldData list the proxy writes to the WAL for a client InsertRequest."""
    ids = {f.name: f for f in schema.fields}
    structs = {s.name: s for s in schema.struct_array_fields}
    out = []
    for fd in client.fields_data:
        if fd.type == DT.ArrayOfStruct:  # checkAndFlattenStructFieldData
            ss = structs[fd.field_name]
            by_raw = {f.name.split("[", 1)[-1].rstrip("]"): f for f in ss.fields}
            for sub in fd.struct_arrays.fields:
                fs = by_raw[sub.field_name]
                flat = schema_pb2.FieldData()
                flat.CopyFrom(sub)
                flat.field_name = f"{ss.name}[{sub.field_name}]" if stored_names else sub.field_name
                flat.field_id = fs.fieldID
                if len(sub.valid_data) and compact_structs is False:
                    _expand_struct_rows(flat)
                if flat.type == DT.Array:  # fillFieldPropertiesOnly
                    flat.scalars.array_data.element_type = fs.element_type
                else:
                    flat.vectors.vector_array.element_type = fs.element_type
                out.append(flat)
            continue
        new = schema_pb2.FieldData()
        new.CopyFrom(fd)
        new.field_id = ids[fd.field_name].fieldID
        valid = list(fd.valid_data)
        if fd.type == DT.Geometry:  # checkGeometryFieldData
            wkb = [wkt_to_wkb(w) for w in fd.scalars.geometry_wkt_data.data]
            new.scalars.ClearField("geometry_wkt_data")
            new.scalars.geometry_data.data.extend(_expand(valid, wkb, b"") if valid else wkb)
        elif fd.type == DT.Timestamptz:  # checkTimestamptzFieldData
            us = [parse_time_tz(s) for s in fd.scalars.string_data.data]
            new.scalars.ClearField("string_data")
            new.scalars.timestamptz_data.data.extend(_expand(valid, us, 0) if valid else us)
        elif valid and fd.WhichOneof("field") == "scalars":  # other nullable scalars: expanded
            slot = fd.scalars.WhichOneof("data") or "string_data"
            vals = list(getattr(fd.scalars, slot).data)
            getattr(new.scalars, slot).ClearField("data")
            getattr(new.scalars, slot).data.extend(_expand(valid, vals, "" if slot == "string_data" else 0))
        out.append(new)  # vectors, nullable or not, stay compact
    return out


def _f32(v: list | None) -> list | None:
    """Values as float32 holds them (what Milvus stores), as Python floats."""
    return None if v is None else np.asarray(v, dtype=np.float32).tolist()


def expected_rows(rows: list[dict] = ROWS) -> list[dict]:
    """What a reader must give back: UTC datetimes, WKB bytes, int8 lists, struct lists, None for nulls."""
    out = []
    for r in rows:
        at = r["at"]
        e = {"id": r["id"], "vec": _f32(r["vec"]), "title": r["title"],
             "shape": None if r["shape"] is None else wkt_to_wkb(r["shape"]),
             "at": None if at is None else dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(
                 microseconds=parse_time_tz(at)),
             "i8v": r["i8v"].tolist(), "nvec": _f32(r["nvec"]), "sparse": None,
             "clips": [{"frame_ids": c["frame_ids"], "emb": _f32(c["emb"])} for c in r["clips"]],
             "marks": None if r["marks"] is None else [{"label": m["label"], "bits": m["bits"], "q": m["q"].tolist()}
                                                        for m in r["marks"]]}
        out.append(e)
    return out


# -- envelopes -------------------------------------------------------------------------------------------------
def insert_request(fields_data: list[Any], n: int, ts: int, *, shard: str = P.VCHANNEL, segment: int = 0) -> Any:
    req = msg_pb2.InsertRequest(base=common_pb2.MsgBase(msg_type=400, msgID=31, timestamp=ts, sourceID=7),
                                shardName=shard, db_name="default", collection_name=NAME, partition_name="_default",
                                collectionID=COLLECTION, partitionID=PARTITION, segmentID=segment, num_rows=n,
                                version=msg_pb2.InsertDataVersion.ColumnBased)
    req.fields_data.extend(fields_data)
    req.timestamps.extend([ts] * n)
    req.rowIDs.extend(range(5000, 5000 + n))
    return req


def create_request(schema: Any, ts: int, *, as_bytes: bool) -> Any:
    """CreateCollectionRequest: schema bytes in #8 (2.5, 2.6.0-2.6.5) or ``collection_schema`` #13 (2.6.6+)."""
    req = msg_pb2.CreateCollectionRequest(base=common_pb2.MsgBase(msg_type=100, timestamp=ts), collectionName=NAME,
                                          collectionID=COLLECTION, partitionIDs=[PARTITION],
                                          virtualChannelNames=[P.VCHANNEL], physicalChannelNames=[P.PCHANNEL])
    if as_bytes:
        req.schema = schema.SerializeToString()
    else:
        req.collection_schema.CopyFrom(schema)
    return req


def messages_25(fields_data: list[Any], n: int, schema: Any, ts0: int) -> list[ProducerMessage]:
    """2.5 msgstream: CreateCollection (#8 bytes), the insert, a time tick (properties ``msg_type``)."""
    tick = msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=1200, timestamp=ts0 + 2))
    return [ProducerMessage(create_request(schema, ts0, as_bytes=True).SerializeToString(),
                            {"msg_type": "CreateCollection"}, ts0),
            ProducerMessage(insert_request(fields_data, n, ts0 + 1, segment=SEGMENT).SerializeToString(),
                            {"msg_type": "Insert"}, ts0 + 1),
            ProducerMessage(tick.SerializeToString(), {"msg_type": "TimeTick"}, ts0 + 2)]


def messages_26(fields_data: list[Any], n: int, schema: Any, tt0: int, *, schema_bytes: bool = False,
                alter: Any = None, schema_change: bool = False) -> list[ProducerMessage]:
    """2.6 WAL: CreateCollection (#13, or #8 bytes as 2.6.0-2.6.5), the insert (body timestamps skewed: the
    ``_tt`` rules), an optional AlterCollection carrying the full new schema (or, ``schema_change``, 2.6.0's
    SchemaChange 12: ``SchemaChangeMessageBody.schema`` = the full schema), a time tick."""
    create = create_request(schema, tt0 - P.PAYLOAD_TS_SKEW, as_bytes=schema_bytes)
    ch = P.vfield(1, COLLECTION) + P.packed(2, [PARTITION]) + P.vfield(3, 1)
    body = insert_request(fields_data, n, tt0 + 1 - P.PAYLOAD_TS_SKEW)
    ih = P.insert_header(COLLECTION, [(PARTITION, n, 64 * n, SEGMENT)])
    out = [ProducerMessage(create.SerializeToString(), P.props(P.T["CreateCollection"], tt0, header=ch), tt0),
           ProducerMessage(body.SerializeToString(), P.props(P.T["Insert"], tt0 + 1, header=ih), tt0 + 1)]
    if alter is not None and schema_change:
        b = P.v2(12, tt0 + 2, header=P.vfield(1, COLLECTION), body=P.lfield(1, alter.SerializeToString()))
        out.append(ProducerMessage(b.payload, b.properties, b.tt))
    elif alter is not None:
        updates = P.lfield(3, NAME) + P.lfield(5, alter.SerializeToString())
        header = P.vfield(1, 1) + P.vfield(2, COLLECTION) + P.lfield(3, P.lfield(1, "schema"))
        b = P.v2("AlterCollection", tt0 + 2, header=header, body=P.lfield(1, updates))
        out.append(ProducerMessage(b.payload, b.properties, b.tt))
    tick = P.timetick(tt0 + 3)
    out.append(ProducerMessage(tick.payload, tick.properties, tick.tt))
    return out


def write(env: Any, ch: str, msgs: list[ProducerMessage]) -> list:
    with env.client() as c, c.create_producer(ch) as prod:
        return [prod.send_batch([m])[0] for m in msgs]
