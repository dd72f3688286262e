"""An append-only log of Parquet files as a Delta table (the mirror's change history, ``mirror/history``): one
version per append, holding the files tasks wrote and an application transaction (app id, version), skipped
when the log already holds it; the commit infos as the log's own record of when it began. Written through the
store (``log.write_commit``), read through delta-rs."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats.delta.handle import deltalake, is_table, table_at
from msgstream_spark.mirror.formats.delta.log import add_of, write_commit
from msgstream_spark.mirror.formats.delta.table import CHECKPOINT_EVERY
from msgstream_spark.mirror.store import open_store, uri


class DeltaChangeLog:
    """The log at ``location`` (``formats.base.ChangeLog``); ``pk`` names the key column (each file's key
    bounds go into its ``add``)."""

    def __init__(self, location: str, pk: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.location, self.pk = location, pk
        self.store = open_store(location, storage_options)
        self.root = uri.parse(location).uri()

    def _dt(self):
        so = self.store.storage_options()
        return table_at(self.location, self.root, so) if is_table(self.location, self.root, so) else None

    def _existing(self):
        dt = self._dt()
        if dt is None:
            raise MirrorError(f"no history table at {self.location} (ensure creates it: HistoryTable.spec)")
        return dt

    def exists(self) -> bool:
        return self._dt() is not None

    def last_batch(self, app: str) -> int | None:
        """The last version the log holds of application ``app`` (None: none, or no log yet)."""
        dt = self._dt()
        v = None if dt is None else dt.transaction_version(app)
        return None if v is None else int(v)

    def ensure(self, schema: pa.Schema, name: str) -> None:
        """Create the log (no rows) with ``schema``, or add the columns of ``schema`` it lacks (nullable)."""
        dt = self._dt()
        dl = deltalake()
        if dt is None:
            dl.DeltaTable.create(self.root, schema, name=name, raise_if_key_not_exists=False,
                                 storage_options=self.store.storage_options())
            return
        have = set(dt.schema().to_arrow().names)
        extra = [f for f in schema if f.name not in have]
        if extra:
            dt.alter.add_columns([dl.Field.from_arrow(f.with_nullable(True)) for f in extra])

    def append(self, paths: list[str], app: str, version: int, info: dict[str, str]) -> bool:
        """One version adding the data files ``paths`` (written under the log's location) with the application
        transaction (``app``, ``version``) and ``info`` in its commit info; False (nothing written) if the log
        already holds that version of ``app``."""
        dt = self._existing()
        done = dt.transaction_version(app)
        if done is not None and int(done) >= version:
            return False
        now = int(time.time() * 1000)
        actions = [{"add": add_of(self.store, self.root, p, self.pk, now, None)} for p in paths]
        actions.append({"txn": {"appId": app, "version": int(version), "lastUpdated": now}})
        version_now = dt.version() + 1
        write_commit(self.store, self.root, version_now, actions, "WRITE", info)
        if version_now % CHECKPOINT_EVERY == 0:  # readers start from the last checkpoint, not every JSON
            dt.update_incremental()
            dt.create_checkpoint()
        return True

    def commit_infos(self) -> list[dict]:
        """Every version's commit info, newest first."""
        return list(self._existing().history())

    def to_arrow(self) -> pa.Table:
        return pa.table(self._existing().to_pyarrow_table())
