"""A batch's new fragments, made by the writing tasks (``WriteSpec.finish``): the driver commits them unread.

A writing task stages its rows in a Parquet file (the shared ``TaskWriter``); as it closes the file it turns it
into one Lance fragment written straight to the table's location through Lance (:class:`FragmentTask`), leaving
out the rows whose key a later change of the same task replaced (the task knows them from its narrow rows), and
writes the fragment's key file. It deletes the Parquet file and reports the fragment's metadata (JSON) in its
result (the file's ``stats``, which the commit gets as ``Plan.info``) and in a small report file beside it
(``data/_fragments/<staged name>.json``: read by the commit when a plan carries no ``info``). The narrow rows
keep naming the staged file and its positions; the commit maps them: the positions the task left out are in the
plan's deletes already, and a fragment from which the plan deletes more (a key changed by two tasks, or a change
not newer than the table's row) is the one case the driver reads: it rewrites that fragment without those rows
(Lance takes no deletion file for a fragment new in the commit). So is a fragment whose vectors' type differs
from the one the table's first rows settle (``fragments.fixed_vectors``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.formats.base import WriteSpec
from msgstream_spark.mirror.formats.lance.direct import FragmentOut, direct_fragment, rewrite
from msgstream_spark.mirror.formats.lance.fragments import (
    data_path,
    fixed_vectors,
    fragment_from_parquet,
    key_file,
    vector_like,
)
from msgstream_spark.mirror.formats.lance.options import lance, storage_options
from msgstream_spark.mirror.store import NotFound, Store, StoreError, uri
from msgstream_spark.mirror.store.parquet import Written

log = logging.getLogger(__name__)

MARK = "lance.fragment"  # the report's fragment metadata (None: every row of the file was superseded)
REPORTS = "_fragments"
FILE_SUFFIXES = (".lance", ".json")  # a fragment's data file, a task's report (``Format.file_suffixes``)


def report_path(staged: str) -> str:
    """The report of the fragment made of the staged Parquet file ``staged``."""
    d, name = staged.rsplit("/", 1)
    return uri.join(d, REPORTS, name.rsplit(".", 1)[0] + ".json")


def vector_sizes(schema: pa.Schema) -> dict[str, int]:
    """The vector columns of ``schema``: their fixed size, -1 for a variable list."""
    return {f.name: (f.type.list_size if pa.types.is_fixed_size_list(f.type) else -1)
            for f in schema if vector_like(f.type) or (pa.types.is_fixed_size_list(f.type)
                                                       and vector_like(pa.list_(f.type.value_type)))}


@dataclass(frozen=True)
class FragmentTask:
    """``WriteSpec.finish`` of a Lance table: a task's staged file as a fragment of the dataset at ``ds_uri``
    (``first``: the table has no fragments yet, its vectors become fixed-size lists of their length)."""

    root: str
    ds_uri: str
    first: bool = False

    def open(self, store: Store, spec: WriteSpec, path: str) -> FragmentOut | None:
        """A task's file of the table: its rows streamed straight into a fragment (``direct.FragmentOut``); None
        for the table's first rows (their vectors' type is settled from all of them: staged as Parquet first)."""
        if self.first:
            return None
        return FragmentOut(store, self.root, self.ds_uri, storage_options(store), spec.schema, spec.pk, path)

    def __call__(self, store: Store, spec: WriteSpec, written: Written, superseded: np.ndarray) -> Written:
        direct = direct_fragment(written)
        if direct is not None:  # streamed by FragmentOut: the rows a later change of the task replaced dropped
            schema = spec.schema
            md = direct if not len(superseded) else rewrite(store, self.root, self.ds_uri, storage_options(store),
                                                             schema, spec.pk, direct, superseded)
            got = None if md is None else (md,)
        else:
            schema = fixed_vectors(spec.schema, store, [written.path]) if self.first else spec.schema
            drop = superseded.astype(np.uint64) if len(superseded) else None
            mode = "append" if schema.equals(spec.schema) else "overwrite"  # (a new vector type: the first rows')
            got = fragment_from_parquet(store, self.root, self.ds_uri, storage_options(store), schema, spec.pk,
                                        written.path, drop, mode)
        report = json.dumps({MARK: None if got is None else got[0].to_json(),
                             "superseded": [int(x) for x in superseded], "vectors": vector_sizes(schema)})
        store.put(report_path(written.path), report.encode())
        if direct is None:
            store.delete(written.path)  # its rows are in the fragment
        return Written(written.path, written.rows, written.size, report)

    def discard(self, store: Store, staged: str, referenced: set[str] | None = None) -> None:
        """A lost task attempt's fragment of ``staged`` (its data file, key file and report) deleted, unless a
        version reads it (``referenced``: the files the table's versions read; None: the caller knows none
        does)."""
        try:
            got = json.loads(store.read(report_path(staged)))
        except NotFound:
            return  # none made, or committed and its report cleared
        if got[MARK] is not None:
            name = got[MARK]["files"][0]["path"]
            if referenced is None or name not in {p.rsplit("/", 1)[-1] for p in referenced}:
                store.delete(data_path(self.root, name))
                store.delete(key_file(self.root, name))
        store.delete(report_path(staged))  # (a report no version reads)


def reports(store: Store, adds: list[str], info: dict[str, tuple[int, str]]) -> dict[str, dict]:
    """The tasks' reports of the plan's added files that are fragments already (a Parquet file a writer without
    ``FragmentTask`` wrote has none)."""
    out = {}
    for p in adds:
        stats = (info.get(p) or (0, ""))[1]
        if stats and MARK in stats:
            out[p] = json.loads(stats)
            continue
        try:
            out[p] = json.loads(store.read(report_path(_store_path(p))))
        except NotFound:
            continue
    return out


def first_schema(schema: pa.Schema, got: dict[str, dict]) -> pa.Schema:
    """The schema the first rows settle from the tasks' reports: a vector column fixed at the one size every
    task gave it, else a variable list."""
    out = []
    for f in schema:
        sizes = {r["vectors"].get(f.name) for r in got.values() if r[MARK] is not None}
        if f.name in vector_sizes(schema) and len(sizes) == 1 and next(iter(sizes)) not in (None, -1):
            f = f.with_type(pa.list_(f.type.value_field, next(iter(sizes))))
        out.append(f)
    return pa.schema(out, metadata=schema.metadata)


def fragments(table: Any, schema: pa.Schema, deletes: dict[str, np.ndarray], got: dict[str, dict],
              mode: str = "append") -> list:
    """The reported fragments to commit with ``schema``: as the tasks wrote them, or rewritten (read by this
    process) without the positions the plan deletes beyond those their task left out, or with a vector type
    that differs from ``schema``'s."""
    lo = lance()
    want = vector_sizes(schema)
    out = []
    for p, r in got.items():
        if r[MARK] is None:
            continue
        md = lo.fragment.FragmentMetadata.from_json(json.dumps(r[MARK]))
        gone = np.asarray(r["superseded"], np.int64)
        rest = np.setdiff1d(np.asarray(deletes.get(p, []), np.int64), gone)
        if len(rest) or r["vectors"] != want:
            log.info("fragment %s of table %s rewritten by the driver: %d row(s) deleted by the plan beyond its "
                     "task's (a key two tasks changed, or a change not newer than the table's)", p, table.location,
                     len(rest))
            md = _rewrite(table, schema, md, rest - np.searchsorted(gone, rest), mode)
        if md is not None:
            out.append(md)
    return out


def _rewrite(table: Any, schema: pa.Schema, md: Any, drop: np.ndarray, mode: str) -> Any:
    """A new fragment of ``md``'s rows minus positions ``drop`` as ``schema`` (``direct.rewrite``)."""
    return rewrite(table.store, table.root, table.uri, table._opts, schema, table.pk, md, drop, mode)


def drop_staged(table: Any, adds: list[str], got: dict[str, dict]) -> None:
    """After the commit: the tasks' reports, and the Parquet files (with their key indexes) of the added files
    turned into fragments by this process."""
    for p in adds:
        if p in got:
            drop_quietly(table, report_path(_store_path(p)))
            continue
        d, name = _store_path(p).rsplit("/", 1)
        for target in (_store_path(p), uri.join(d, "_keys", name + ".keys")):
            drop_quietly(table, target)


def drop_quietly(table: Any, target: str) -> None:
    try:
        table.store.delete(target)
    except (OSError, StoreError) as e:  # a leftover is an orphan (orphans, vacuum): logged, never fatal
        log.warning("could not delete %s after its rows were committed to %s: %s", target, table.location, e)


def _store_path(path: str) -> str:
    return path if "://" in path else uri.parse(path).uri()
