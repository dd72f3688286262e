"""Many collections in one mirror job, Spark-free: which collections it keeps, where each one's table lives, and
what it learned of them from the stream (kept beside the job's checkpoint).

Naming rule (stable, docs/mirror.md "Many collections"): collection ``name`` of database ``db`` with id ``cid``
is mirrored into ``<root>/<db>/<name>``; when a table of another collection id already holds that location (the
name was dropped and created again: Milvus gives the new collection a new id, never the old one), the later
collection goes to ``<root>/<db>/<name>__<cid>``. The collection id decides, never the name: the table records
its id (``msgstream.collection_id``) and a restart finds each collection's table by it. A collection whose
database the stream does not tell (2.3-2.6.5 write no database into CreateCollection; inserts carry it) waits
for its first insert; one whose name the stream never tells is not mirrored.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import asdict, dataclass, field

from msgstream_spark.errors import MirrorError

STATE_FILE = "collections.json"
PROP_DROPPED_TS = "msgstream.mirror.dropped_ts"  # the table property a dropped collection's table gets
PROP_NAME = "msgstream.mirror.name"  # a renamed collection's table: <db>.<name> the collection has now
PROP_RENAMED_TS = "msgstream.mirror.renamed_ts"  # ... and the time of the rename (2.6.6+ AlterCollection)
DEFAULT_DB = "default"
_NAME = re.compile(r"^[A-Za-z0-9_.$-]+$")


@dataclass(frozen=True)
class Selection:
    """``--database``, ``--collections`` (``name`` or ``db.name``) or ``--include`` (a regex on ``db.name``)."""

    database: str | None = None
    collections: tuple[str, ...] = ()
    include: str | None = None

    def matches(self, db: str, name: str) -> bool:
        if self.database is not None:
            return db == self.database
        if self.collections:
            return name in self.collections or f"{db}.{name}" in self.collections
        return self.include is not None and re.fullmatch(self.include, f"{db}.{name}") is not None

    def describe(self) -> str:
        if self.database is not None:
            return f"--database {self.database}"
        return f"--collections {','.join(self.collections)}" if self.collections else f"--include {self.include}"


def parse_selection(database: str | None, collections: str | None, include: str | None) -> Selection:
    """The one selection given; MirrorError naming the flag for a bad value."""
    if include is not None:
        try:
            re.compile(include)
        except re.error as exc:
            raise MirrorError(f"--include {include!r} is not a regular expression: {exc}") from exc
        return Selection(include=include)
    if collections is not None:
        names = tuple(c.strip() for c in collections.split(",") if c.strip())
        if not names:
            raise MirrorError("--collections names no collection (a comma-separated list: a,b or db.a,db.b)")
        return Selection(collections=names)
    return Selection(database=database)


@dataclass
class Known:
    """What the stream told of one collection."""

    cid: int
    name: str = ""
    db: str = ""
    schema: str = ""  # base64 CollectionSchema of its CreateCollection, else the one its table was made with
    created_ts: int | None = None
    schema_ts: int | None = None  # the time of its newest schema change (None: the creation's schema)
    dropped_ts: int | None = None
    location: str = ""  # its table, once made
    renamed_ts: int | None = None  # the time of its newest rename (2.6.6+: name and db are the new ones)
    pending: bool = False  # its snapshot runs beside the stream, not handed over yet (its rows are staged)
    gone: bool = False  # pending, but dropped from Milvus before its snapshot committed: never a table


@dataclass
class ManyState:
    """The collections the job has seen, kept in ``<checkpoint>/collections.json`` (on the driver's disk, with
    Spark's checkpoint): written before a batch's tables are written, so a restart knows every schema the stream
    carried in a batch Spark already committed."""

    path: str
    known: dict[int, Known] = field(default_factory=dict)
    _saved: dict | None = field(default=None, repr=False, compare=False)  # what the last save wrote

    @classmethod
    def load(cls, checkpoint: str) -> ManyState:
        path = os.path.join(checkpoint, STATE_FILE)
        st = cls(path)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    raw = json.load(f)
                st.known = {int(k): Known(**v) for k, v in raw.items()}
            except (OSError, ValueError, TypeError) as exc:
                raise MirrorError(f"the mirror job's collection list {path} is unreadable: {exc}") from exc
        return st

    def save(self) -> None:
        """Write the list (atomically), unless it is what this object's last save wrote: a batch of collections
        the job knows tells nothing new (the database job saves before each batch's writes)."""
        data = {str(k): asdict(v) for k, v in sorted(self.known.items())}
        if data == self._saved:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, self.path)
        self._saved = data

    def get(self, cid: int) -> Known:
        return self.known.setdefault(cid, Known(cid))

    def created(self, cid: int, name: str, db: str, schema: bytes | None, ts: int) -> None:
        k = self.get(cid)
        k.name = k.name or name
        k.db = k.db or db
        if schema and not k.schema:
            k.schema = base64.b64encode(schema).decode()
        k.created_ts = k.created_ts or ts

    def seen(self, cid: int, name: str, db: str) -> None:
        """Rows of the collection: their request's names (a database left empty there is Milvus's default)."""
        k = self.get(cid)
        k.name = k.name or name
        k.db = k.db or db or DEFAULT_DB

    def altered(self, cid: int, schema: bytes, ts: int) -> bool:
        """A newer schema (2.6 AlterCollection / SchemaChange); False if the one kept is as new."""
        k = self.get(cid)
        if k.schema_ts is not None and k.schema_ts >= ts:
            return False
        k.schema, k.schema_ts = base64.b64encode(schema).decode(), ts
        return True

    def renamed(self, cid: int, name: str, db: str, ts: int) -> None:
        """A 2.6.6+ AlterCollection of the collection's name and/or database ("" : unchanged); an older one
        (another vchannel's copy of a rename already taken, or an older rename) changes nothing."""
        k = self.get(cid)
        new = (name or k.name, db or k.db)
        if (k.renamed_ts is not None and k.renamed_ts >= ts) or new == (k.name, k.db):
            return  # 2.6.6+ writes one copy per vchannel (and the control vchannel), each at its own time
        (k.name, k.db), k.renamed_ts = new, ts

    def schema_bytes(self, cid: int) -> bytes | None:
        k = self.known.get(cid)
        return base64.b64decode(k.schema) if k is not None and k.schema else None


def _check_names(db: str, name: str, where: str) -> None:
    ident = where.startswith("--namespace")  # an identifier's part: no '.'
    for part, what in ((db, "database"), (name, "collection")):
        if not _NAME.match(part) or part in (".", "..") or (ident and "." in part):
            kind = "a part of the table's identifier" if ident else "a path part of the table"
            raise MirrorError(f"{what} name {part!r} cannot be {kind} under {where}")


def table_identifier(namespace: str, db: str, name: str, cid: int, holder_id: int | None) -> str:
    """The Iceberg identifier of collection ``cid`` in namespace ``namespace`` of a catalog (``--catalog NAME
    --namespace NS``): ``<NS>.<db>__<name>``, a later collection of a name another collection's table holds
    ``<NS>.<db>__<name>__<cid>``; one namespace level for every table (catalogs that allow only a few top-level
    namespaces, such as REST catalogs placing tables themselves, take it as they take one table)."""
    if not namespace or any(not _NAME.match(p) or "." in p for p in namespace.split(".")) or "$" in namespace:
        raise MirrorError(f"--namespace {namespace!r} is not an Iceberg namespace (dot-separated names of letters, "
                          "digits, '_' and '-')")
    _check_names(db, name, f"--namespace {namespace}")
    base = f"{namespace}.{db}__{name}"
    return base if holder_id is None or holder_id == cid else f"{base}__{cid}"


def table_location(root: str, db: str, name: str, cid: int, holder_id: int | None) -> str:
    """The table of collection ``cid`` (the naming rule above); ``holder_id``: the collection id of the table
    already at ``<root>/<db>/<name>`` (None: no table there)."""
    _check_names(db, name, f"--table-root {root}")
    base = f"{root.rstrip('/')}/{db}/{name}"
    return base if holder_id is None or holder_id == cid else f"{base}__{cid}"
