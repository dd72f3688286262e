"""The table formats' seam (#46): no code outside ``mirror/formats/`` names a format or tests a table's class (the
rest asks ``formats.registry``), and inside ``mirror/`` every import goes downward (formats never import the write
path above them). Parses the source with ``ast``; a violation is reported with its file and line.

What counts as naming a format, in code outside ``msgstream_spark/mirror/formats/`` (the package, ``jobs/``,
``pyspark_msgstream/``):
- an import of a format's own modules (``mirror.formats.delta``, ``mirror.formats.iceberg``, ``formats.detect``, any
  other than the seam: ``formats.base`` and ``formats.registry``) or of a table library (``deltalake``,
  ``pyiceberg``, ``lance``, ``lancedb``);
- an identifier (a name, attribute, function, class or argument) with a format's name as a word of it
  (``DeltaMirrorTable``, ``is_iceberg``, ``DELTA_ONLY``; ``_delta_log`` is a file name, not a format: a word starts
  after ``_`` only when the name is split on it, so ``delta`` must be a whole ``_``-separated or CamelCase part);
- a string constant equal to a format's name (``"delta"``, case aside): a format chosen by code;
- an ``isinstance`` / ``issubclass`` test against a table class (a class whose name ends in ``Table``, other than
  pyarrow's ``pa.Table``): the registry's ``of(table)`` says which format a table is.
Prose (docstrings, comments, messages and help text that mention a format) is not counted: help text that lists
the formats is generated from the registry. No module is exempt (``ALLOWED`` is empty: the change history's log,
the demo's choice of format and delta-rs's own storage keys are the registry's: ``change_log``, ``default``,
``Format.storage_keys``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layers import PKG, _imports, _modules

ROOT = PKG.parent
# every format's name, the registry's and the one being added (the registry's names are a subset: checked below)
FORMAT_NAMES = ("delta", "iceberg", "lance")
TABLE_LIBRARIES = ("deltalake", "pyiceberg", "lance", "lancedb")
SEAM = ("msgstream_spark.mirror.formats", "msgstream_spark.mirror.formats.base",
        "msgstream_spark.mirror.formats.registry")
# module -> why it may name a format (none now; a new entry needs its reason and a note in docs/internals.md)
ALLOWED: dict[str, str] = {}
# identifiers whose "delta" is no table format
NOT_FORMATS = {"delta_path": "Milvus's delta (delete) binlogs"}
# mirror/'s own layers, lowest first: a module imports its own layer and those below it
MIRROR_LAYERS = [("order", "collapse"), ("store",), ("common", "watermark"), ("formats",), ("write",),
                 ("snapshot",), ("table", "apply", "maintenance", "policy", "report", "upkeep"), ("verify", "history")]
MIRROR_RANK = {part: i for i, parts in enumerate(MIRROR_LAYERS) for part in parts}


def _sources() -> list[Path]:
    out = [p for p in sorted(PKG.rglob("*.py")) if "mirror/formats" not in p.relative_to(PKG).as_posix()
           and not p.name.endswith("_pb2.py")]
    return out + sorted((ROOT / "jobs").glob("*.py")) + sorted((ROOT / "pyspark_msgstream").glob("*.py"))


def _words(name: str) -> set[str]:
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().split("_")
    return {p for p in parts if p}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _namings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.rsplit(".", 1)[-1]]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
              and node.value.strip().lower() in FORMAT_NAMES):
            found.append(f"{where}:{node.lineno}: the string {node.value!r} (a format chosen by code)")
        for n in names:
            if (_words(n) & set(FORMAT_NAMES) or n in TABLE_LIBRARIES) and n not in NOT_FORMATS:
                found.append(f"{where}:{node.lineno}: {n}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            for cls in (node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]):
                text = ast.unparse(cls)
                if text.endswith("Table") and text not in ("pa.Table", "pyarrow.Table"):
                    found.append(f"{where}:{node.lineno}: isinstance test on a table class {text} (ask registry.of)")
    return found


def _format_imports(path: Path, module: str) -> list[str]:
    where = path.relative_to(ROOT).as_posix()
    out = []
    for target, line, _ in _imports(path, module, typing=True):
        if target.split(".")[0] in TABLE_LIBRARIES:
            out.append(f"{where}:{line}: imports {target}")
        elif target.startswith("msgstream_spark.mirror.formats") and not any(
                target == s or target.startswith(s + ".") and s != SEAM[0] for s in SEAM):
            out.append(f"{where}:{line}: imports {target} (ask formats.registry / formats.base)")
    return out


def test_no_code_outside_formats_names_a_format():
    bad = []
    for path in _sources():
        where = path.relative_to(ROOT).as_posix()
        if where in ALLOWED:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        bad += _namings(path) + _format_imports(path, module)
    assert not bad, "a format named outside mirror/formats/ (ask formats.registry):\n" + "\n".join(sorted(set(bad)))


def test_the_names_are_the_registrys():
    """Every format the registry lists is one the check looks for (a new format adds its name above)."""
    from msgstream_spark.mirror.formats import registry

    assert set(registry.names()) <= set(FORMAT_NAMES), registry.names()


def test_the_check_finds_a_format_named(tmp_path):
    """The scan is no blind spot: each kind of naming in a module is found, prose is not."""
    src = tmp_path / "probe.py"
    src.write_text('"""Delta or Iceberg: prose."""\nimport deltalake\nfrom x import DeltaMirrorTable\n'
                   'fmt = "iceberg"\nif isinstance(t, IcebergMirrorTable):\n    pass\nmark = "_delta_log"\n'
                   'msg = f"a Delta table {fmt}"\nok = isinstance(x, pa.Table) or isinstance(t, (int, HistTable))\n'
                   'import lance\nLANCE_KEYS = 1\n')
    got = _namings(src)
    assert sorted({int(g.split(":")[1]) for g in got}) == [2, 3, 4, 5, 9, 10, 11], got
    assert any("isinstance test on a table class HistTable" in g for g in got), got


def _mirror_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "mirror" else None


def test_mirror_imports_go_downward_only():
    """Inside mirror/: the shared core, then the store, the formats, the write path, the snapshot routes, the
    table calls and maintenance, verify and the history (formats never import write/)."""
    bad = []
    for mod, path in _modules().items():
        src = _mirror_part(mod)
        if src is None:
            continue
        for target, line, _ in _imports(path, mod, typing=True):
            dst = _mirror_part(target)
            if dst is None or dst == src or target not in _modules():
                continue
            if MIRROR_RANK[dst] > MIRROR_RANK[src]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: mirror/{src} imports {target} (mirror/{dst} is above)")
    assert not bad, "upward imports inside mirror/:\n" + "\n".join(sorted(bad))


def test_one_batch_protocol():
    """A batch is committed in one place (``write.batch.run_batch``, through ``commit_plan``) whichever runner ran
    its steps (the local one of ``apply_batch``, ``MirrorBatch``'s Spark one, the repair's), and a table has no
    ``merge`` of its own: ``apply_batch`` is the one name for applying a batch."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "commit"
                    and any(k.arg == "query_id" for k in node.keywords)
                    and where != "msgstream_spark/mirror/write/batch.py"):
                found.append(f"{where}:{node.lineno}: a batch's commit outside write/batch.py")
            if isinstance(node, ast.FunctionDef) and node.name in ("merge", "apply_local"):
                found.append(f"{where}:{node.lineno}: def {node.name} (apply_batch applies a batch)")
    assert not found, "\n".join(found)


STORAGE_CLIENTS = ("pyarrow.fs", "fsspec", "s3fs", "gcsfs", "adlfs", "boto3", "botocore")
ARROW_FILESYSTEMS = {"FileSystem", "LocalFileSystem", "S3FileSystem", "GcsFileSystem", "AzureFileSystem",
                     "HadoopFileSystem", "SubTreeFileSystem", "PyFileSystem", "FileSelector"}


def _other_storage_clients(path: Path, module: str) -> list[str]:
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    out = [f"{where}:{line}: imports {target}" for target, line, _ in _imports(path, module, typing=True)
           if any(target == c or target.startswith(c + ".") for c in STORAGE_CLIENTS)]  # also from pyarrow import fs
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in ARROW_FILESYSTEMS:
            out.append(f"{where}:{node.lineno}: {name} (a pyarrow file system)")
        if isinstance(node, ast.keyword) and node.arg == "filesystem":
            out.append(f"{where}:{node.lineno}: filesystem= (a pyarrow file system handed to a reader or writer)")
    return out


def test_one_storage_client():
    """Everything the mirror reads or writes (tables, the storage snapshot's Milvus files, key indexes, leases)
    goes through ``mirror.store.Store`` (obstore, or the local file system): no product module makes a pyarrow
    file system or imports another object-storage client (pyiceberg's FileIO and delta-rs are handed the store's
    settings)."""
    bad = []
    for path in [*sorted(PKG.rglob("*.py")), *sorted((ROOT / "jobs").glob("*.py")),
                 *sorted((ROOT / "pyspark_msgstream").glob("*.py"))]:
        if path.name.endswith("_pb2.py"):
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        bad += _other_storage_clients(path, module)
    assert not bad, "a storage client other than the Store:\n" + "\n".join(sorted(set(bad)))


def test_the_storage_client_check_finds_a_pyarrow_file_system(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text('"""S3FileSystem in prose."""\nfrom pyarrow import fs\nimport boto3\n'
                   'x = fs.S3FileSystem()\npq.read_table("p", filesystem=x)\n')
    got = _other_storage_clients(src, "probe")
    assert sorted(int(g.split(":")[1]) for g in got) == [2, 3, 4, 5], got
