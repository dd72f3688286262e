"""A v2 snapshot's manifest list written with what does not change between commits built once (issue #44: the
database job commits every table of a database per batch in its driver, and a table's list grows with its
manifests): the list's Avro schemas and record writer (pyiceberg builds them at each list it writes), and each
manifest's encoded record, kept by manifest path and sequence numbers (a manifest carried into the next list is
the same record: what its file holds never changes, its sequence numbers are assigned once), so a commit encodes
only its new manifests. The file is what pyiceberg's ``ManifestListWriterV2`` writes with the same sync marker,
byte for byte (``tests/mirror/store/test_iceberg_commit_cpu.py``): its header, then one Avro block of the records.
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from typing import Any

from msgstream_spark.mirror.formats.iceberg.cached import known_schema_output

RECORDS_KEPT = 8192  # manifests' encoded records kept (a database job's tables' live manifests)
_records: OrderedDict[tuple, bytes] = OrderedDict()
_lock = threading.Lock()
_built: dict[str, tuple] = {}


def _schemas() -> tuple:
    """(file schema, record writer, the file schema's Avro JSON) of a v2 manifest list, built once."""
    got = _built.get("v2")
    if got is None:
        from pyiceberg.avro.resolver import resolve_writer
        from pyiceberg.manifest import DEFAULT_READ_VERSION, MANIFEST_LIST_FILE_SCHEMAS
        from pyiceberg.utils.schema_conversion import AvroSchemaConversion

        file_schema = MANIFEST_LIST_FILE_SCHEMAS[2]
        writer = resolve_writer(record_schema=MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION], file_schema=file_schema)
        avro = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_file"))
        got = _built["v2"] = (file_schema, writer, avro)
    return got


def _encoded(writer, manifest) -> bytes:
    """``manifest``'s record as the list's writer encodes it (kept by path and sequence numbers)."""
    from pyiceberg.avro.encoder import BinaryEncoder

    key = (manifest.manifest_path, manifest.sequence_number, manifest.min_sequence_number)
    with _lock:
        got = _records.get(key)
    if got is None:
        out = io.BytesIO()
        writer.write(BinaryEncoder(out), manifest)
        got = out.getvalue()
        with _lock:
            _records[key] = got
            while len(_records) > RECORDS_KEPT:
                _records.popitem(last=False)
    return got


def write_list(output_file, meta: dict[str, str], prepared: tuple) -> None:
    """Manifest list ``output_file`` (a pyiceberg ``OutputFile``) of a v2 table: header metadata ``meta`` (the
    snapshot's ids, sequence number, format version, codec), the ``prepared`` manifests (sequence numbers
    assigned: ``ManifestListWriterV2.prepare_manifest``) in one block."""
    built = _schemas()
    with known_schema_output(output_file, built, meta) as f:
        content = b"".join(_encoded(built[1], m) for m in prepared)
        codec = f.compression_codec()
        enc: Any = f.encoder
        enc.write_int(len(prepared))
        size = len(content)
        if codec is not None:
            content, size = codec.compress(content)
        enc.write_int(size)
        enc.write(content)
        enc.write(f.sync_bytes)
