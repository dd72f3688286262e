"""The package's structure: layers import downward only, no cycles, small modules and functions.

Parses every module of ``msgstream_spark`` with ``ast`` (nothing is imported), so a violation
is reported with the file and line that causes it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "msgstream_spark"

# Lowest first; a module may import its own layer and the ones below it (design.md, "Layers").
LAYERS = ["errors", "msg", "config", "mq", "stream", "sink", "source", "mirror", "spark", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# cli and jobs sit on top, side by side (a job uses the CLI's shared argument and data helpers; the CLI runs a
# job by importing it when its command runs: cli/job_commands.py); spark (the adapters only) uses the Spark-free
# read (source) and write (sink) cores below it; mirror (table keeping) sits between spark and source
TOP = ("cli", "jobs", "__main__")
RANK.update({name: RANK["cli"] for name in TOP})
SPARK_LAYER = "spark"  # the only layer of the package that imports pyspark at module top
# may import pyspark, but inside functions only: a job starts its SparkSession first (pyspark_msgstream/ too)
SPARK_USERS = ("jobs",)
# The jobs import what they run inside their functions: pyspark, the Spark adapters, pymilvus's and the table
# libraries' users load when the job runs, after its SparkSession (and `msgstream --help` loads none of them).
LAZY_LAYERS = ("jobs",)

# Imports allowed inside functions: optional clients and pyspark stay lazy so a missing extra
# breaks only what needs it, and the Spark-free layers load without the JVM bridge.
LAZY_ALLOWED = ("confluent_kafka", "pulsar", "pyspark", "grpc", "deltalake", "pyiceberg", "lance", "pyroaring",
                "obstore", "pymilvus", "sqlalchemy")  # (sqlalchemy: pyiceberg's SQL catalog's, with it)
# Modules of an always-installed library that are slow to load, imported where used: the SDK pymilvus and
# pyarrow.dataset each load pandas (~0.5 s and ~0.4 s of CPU at every command's start).
LAZY_ALLOWED_MODULES = ("pyarrow.dataset",)
# What `msgstream <command>` must start without (test_the_cli_starts_without_the_heavy_libraries).
CLI_NEVER_LOADS = ("pymilvus", "pandas", "pyspark", "deltalake", "pyiceberg", "lance", "pyarrow.dataset", "grpc")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path, module: str, typing: bool = False) -> list[tuple[str, int, bool]]:
    """(imported module, line, at function level) for every import of the package's modules (``typing``: also
    those under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, nested) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".")[: len(module.split(".")) - child.level + (path.name == "__init__.py")]
                    base = ".".join(pkg + ([base] if base else []))
                found.append((base, child.lineno, nested))
                found.extend((f"{base}.{a.name}", child.lineno, nested) for a in child.names)
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and not typing:
                continue  # typing-only imports are not imports at run time
            visit(child, inner)

    visit(tree, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _graph(typing: bool = False) -> tuple[dict[str, set[str]], list[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    problems = []
    for mod, path in mods.items():
        for target, line, nested in _imports(path, mod, typing):
            root = target.split(".")[0]
            if nested and root != "msgstream_spark" and root not in LAZY_ALLOWED and target not in LAZY_ALLOWED_MODULES:
                problems.append(f"{path.relative_to(PKG.parent)}:{line}: function-level import of {target}")
            if target not in mods or target == mod:
                continue
            if nested and _layer(mod) not in LAZY_LAYERS:
                problems.append(f"{path.relative_to(PKG.parent)}:{line}: function-level import of {target} "
                                "(import package modules at module top)")
            graph[mod].add(target)
    return graph, problems


def test_imports_go_downward_only():
    graph, _ = _graph()
    bad = []
    for mod, targets in graph.items():
        src = _layer(mod)
        for t in targets:
            dst = _layer(t)
            if src is None or dst is None or src == dst or (src in TOP and dst in TOP):
                continue
            if RANK[dst] >= RANK[src]:
                bad.append(f"{mod} ({src}) imports {t} ({dst})")
    assert not bad, "upward or sideways imports:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph, _ = _graph(typing=True)  # a cycle hidden behind TYPE_CHECKING still ties two modules together
    # A package imports its submodules through __init__; only edges between modules count.
    state: dict[str, int] = {}
    cycles = []

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1 and not _is_package_edge(stack[stack.index(nxt):] + [nxt]):
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _is_package_edge(cycle: list[str]) -> bool:
    """``pkg.mod -> pkg`` (reaching one's own package __init__) is how Python loads packages."""
    return any(b != a and a.startswith(b + ".") for a, b in zip(cycle, cycle[1:]))


def _pyspark_lines(path: Path) -> list[int]:
    """Lines importing pyspark anywhere in the module (module top, functions, typing blocks)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "pyspark" or n.startswith("pyspark.") for n in names):
            out.append(node.lineno)
    return out


def test_pyspark_only_in_the_spark_adapters():
    """Spark is a thin adapter: no pyspark import outside ``spark/`` (and the jobs), and every module in spark/
    imports pyspark; the jobs import it inside functions only, so the CLI's Spark-free commands never load it."""
    bad = []
    for mod, path in _modules().items():
        lines = _pyspark_lines(path)
        if _layer(mod) == SPARK_LAYER:
            if not lines and path.name != "__init__.py":
                bad.append(f"{mod}: in spark/ without importing pyspark (Spark-free code goes to source/ or sink/)")
        elif _layer(mod) in SPARK_USERS:
            top = [ln for target, ln, nested in _imports(path, mod, typing=True)
                   if not nested and target.split(".")[0] == "pyspark"]
            top += [ln for target, ln, nested in _imports(path, mod, typing=True)
                    if not nested and _layer(target) == SPARK_LAYER and target.startswith("msgstream_spark.")]
            if top:
                bad.append(f"{path.relative_to(PKG.parent)}:{min(top)}: a job imports pyspark (or spark/) at "
                           "module top")
        elif lines:
            bad.append(f"{path.relative_to(PKG.parent)}:{lines[0]}: imports pyspark outside spark/")
    assert not bad, "\n".join(bad)


def test_imports_at_module_top():
    _, problems = _graph()
    assert not problems, "\n".join(problems)


def test_the_cli_starts_without_the_heavy_libraries():
    """`msgstream`'s module graph loads no SDK, engine or table library: each command pays only what it uses (the
    suite starts ~100 command processes; pymilvus and pyarrow.dataset alone were ~0.45 s of CPU each)."""
    code = ("import sys, msgstream_spark.cli.main; "
            f"print(' '.join(m for m in {CLI_NEVER_LOADS!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=PKG.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [], f"`import msgstream_spark.cli.main` loads {done.stdout.split()}"


def test_modules_and_functions_are_small():
    """The package, the jobs and the auto-registration module (bench and the test broker aside)."""
    too_big = []
    paths = {**_modules(), **{f"{p.parent.name}.{p.stem}": p for d in ("jobs", "pyspark_msgstream")
                              for p in sorted((PKG.parent / d).glob("*.py"))}}
    for mod, path in paths.items():
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            too_big.append(f"{mod}: {n} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{mod}.{node.name} (line {node.lineno}): {length} lines "
                                   f"(max {MAX_FUNCTION_LINES})")
    assert not too_big, "\n".join(too_big)


# Methods only Spark calls (the Python data source API), by name.
SPARK_CALLBACKS = {"streamReader", "streamWriter", "initialOffset", "getDefaultReadLimit",
                   "prepareForTriggerAvailableNow", "reportLatestOffset",
                   # pyiceberg's snapshot producer calls these on mirror/formats/iceberg/commit.py's subclass
                   "_validate_concurrency", "_deleted_entries", "_existing_manifests", "_manifests",
                   # and its Avro output file this on mirror/formats/iceberg/cached.py's
                   "_write_header"}


def test_every_function_and_class_has_a_caller():
    """A def whose name appears nowhere else (package, jobs, tests, tools, bench) is dead code.

    By name only, so a caller of any same-named def counts: this finds code nothing reaches, not
    every unused overload.
    """
    root = PKG.parent
    defs, refs = [], set()
    for base in ("msgstream_spark", "jobs", "tests", "pyspark_msgstream", "tools", "bench"):
        for path in (root / base).rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if base == "msgstream_spark" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                    ast.ClassDef)):
                    defs.append((node.name, f"{path.relative_to(root)}:{node.lineno}"))
                elif isinstance(node, ast.Name):
                    refs.add(node.id)
                elif isinstance(node, ast.Attribute):
                    refs.add(node.attr)
                elif isinstance(node, ast.alias):
                    refs.add(node.name.rsplit(".", 1)[-1])
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    refs.add(node.value)  # getattr(obj, "name"), entry points
    dead = [f"{where}: {name}" for name, where in defs
            if not name.startswith("__") and name not in refs and name not in SPARK_CALLBACKS]
    assert not dead, "no caller anywhere:\n" + "\n".join(sorted(dead))


def test_the_suite_never_skips_over_a_broken_product_module():
    """``importorskip`` of the project's own packages turns a broken import into a skip: import them."""
    own = ("msgstream_spark", "pyspark_msgstream", "jobs", "tests")
    found = []
    for path in (PKG.parent / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "importorskip" and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).split(".")[0] in own):
                found.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: importorskip({node.args[0].value!r})")
    assert not found, "\n".join(found)
