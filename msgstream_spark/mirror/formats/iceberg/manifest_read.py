"""An Iceberg manifest's entries and a manifest list's manifests read with the Avro reader built once per file schema.

pyiceberg's ``AvroFile`` converts a file's Avro schema to an Iceberg schema and resolves a reader tree against
the read schema at every file it opens: ~60% of reading a small manifest (~1.5 of ~2.5 ms). Every manifest of a
table, and every table of a database job, carries the same schema, and a database job's batch reads each touched
table's new manifests (a restarted job: all of them, ~10-20 ms a table). Here the reader tree is kept per (file
schema, read schema) and shared (a reader holds no state between reads: each read builds its own records); the
records are pyiceberg's own, so callers see what ``ManifestFile.fetch_manifest_entry`` and
``Snapshot.manifests`` give. Relies on pyiceberg's ``AvroFile`` internals (pinned below 0.13, as
``manifest_list.py``).
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

SCHEMA_KEY = "avro.schema"  # the header's metadata key holding the file's Avro schema (JSON)
KEPT = 64  # reader trees kept (one per file schema in practice: a table's partition spec changes it)
_readers: dict[tuple, tuple[Any, Any]] = {}
_lock = threading.Lock()
built = 0  # reader trees built in this process (a test counts them)


@cache
def _kinds() -> dict[str, tuple]:
    """(read schema, record types, enums) of a manifest's entries and of a manifest list (pyiceberg's)."""
    from pyiceberg import manifest as M

    return {"entries": (M.MANIFEST_ENTRY_SCHEMAS[M.DEFAULT_READ_VERSION], {-1: M.ManifestEntry, 2: M.DataFile},
                        {0: M.ManifestEntryStatus, 101: M.FileFormat, 134: M.DataFileContent}),
            "list": (M.MANIFEST_LIST_FILE_SCHEMAS[M.DEFAULT_READ_VERSION], {-1: M.ManifestFile,
                                                                            508: M.PartitionFieldSummary},
                     {517: M.ManifestContent})}


@cache
def _file_class() -> type:
    """``AvroFile`` whose header reader and resolved reader tree are built once per file schema (pyiceberg imported
    at the first read: an optional client)."""
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader
    from pyiceberg.avro.resolver import construct_reader, resolve_reader

    header_reader = construct_reader(META_SCHEMA, {-1: AvroFileHeader})

    class SharedReaderFile(AvroFile):
        def __enter__(self):
            global built
            with self.input_file.open() as f:
                self.decoder = new_decoder(f.read())
            self.header = header_reader.read(self.decoder)
            key = (self.header.meta.get(SCHEMA_KEY), id(self.read_schema))
            with _lock:
                got = _readers.get(key)
            if got is None:
                schema = self.header.get_schema()
                got = (schema, resolve_reader(schema, self.read_schema or schema, self.read_types, self.read_enums))
                with _lock:
                    if key[0] is not None:  # a file without its schema in the header: nothing to share it by
                        if len(_readers) >= KEPT:
                            _readers.clear()
                        _readers[key] = got
                    built += 1
            self.schema, self.reader = got
            return self

    return SharedReaderFile


def _read(path: str, io: Any, kind: str) -> Any:
    schema, types, enums = _kinds()[kind]
    return _file_class()(io.new_input(path), schema, read_types=types, read_enums=enums)


def manifest_entries(m: Any, io: Any, discard_deleted: bool = True) -> list:
    """``m.fetch_manifest_entry(io, discard_deleted)`` (``m``: a ``ManifestFile``), its reader tree shared."""
    from pyiceberg.manifest import ManifestEntryStatus, _inherit_from_manifest

    with _read(m.manifest_path, io, "entries") as reader:
        return [_inherit_from_manifest(e, m) for e in reader
                if not discard_deleted or e.status != ManifestEntryStatus.DELETED]


def list_manifests(path: str, io: Any) -> list:
    """``Snapshot.manifests(io)`` of a snapshot whose manifest list is ``path``, its reader tree shared."""
    with _read(path, io, "list") as reader:
        return list(reader)
