"""Pack msgstream-spark and its dependencies into a relocatable environment archive for a Spark cluster.

Executors on other machines do not have the package installed. Spark's standard route is to ship
a Python environment with the job: ``spark-submit --archives env.tar.gz#environment --conf
spark.pyspark.python=./environment/bin/python``. This script builds that archive:

1. a wheel of this project (``pip wheel --no-deps`` of a copy of the checkout without build outputs), or a
   wheel given with ``--wheel``;
2. a fresh venv made by the same interpreter that runs the script;
3. the wheel and its runtime dependencies (with the chosen extras) installed into it, *except
   pyspark*: executors import pyspark from the worker's Spark installation (``pyspark.zip`` on
   their PYTHONPATH), and the pyspark wheel would add ~500 MB; ``--without`` leaves out more (distributions the
   jobs do not use, with what only they need: ``--without pylance`` for jobs that write no Lance table, ~220 of
   the ~790 MiB every driver and executor unpacks);
4. the venv, tarred and gzipped, without the test suites the dependencies install inside their packages.

Like venv-pack, the archive holds the packages but not the interpreter: ``bin/python`` links to
the interpreter that built it, so every worker needs that Python version at the same path (the
usual case for machines built from one image). For a self-contained interpreter use conda-pack.

``--cache-dir`` keeps archives keyed by the wheel's content (its RECORD), the interpreter and the
extras, so an unchanged project is packed once; and, keyed by the requirements, extras and interpreter
only, the venv of the dependencies alone: after a code change the archive is that venv copied (hard links where
the cache and the temp directory share a file system: pip replaces a file by unlinking it, never writes into one),
the new wheel installed into it (``--no-deps``) and packed, without installing the dependencies again.

Usage: ``python tools/pack_env.py --output dist/msgstream-env.tar.gz [--extras kafka,pulsar]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "msgstream-spark"
# Shipped by the worker's Spark installation, never by the archive.
EXCLUDED = {"pyspark"}
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_EXTRA_CLAUSE = re.compile(r"""(\band\s+)?extra\s*==\s*["'][^"']+["'](\s+and\b)?""")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# What a wheel must not be built from: setuptools builds inside the source tree and packs whatever build/lib
# holds, so a build/ left by an earlier layout (the top-level jobs/ package before issue #31) would ship again.
# The checkout's other environments (`make test` makes .venv-rest, ~400 MiB, and .node-azurite, ~190 MiB) are
# not sources either: copying them cost every wheel build ~12 s of CPU.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", ".node-*", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".ruff_cache", "msgstream-data", "demo-output", "chaos-results*",
                                    "spark-warehouse")


def build_wheel(out_dir: Path, python: str = sys.executable, timeout: float = 300, root: Path = ROOT) -> Path:
    """A wheel of the project at ``root`` (no dependencies) in ``out_dir``, built from a copy of its sources
    (no build outputs: see NOT_SOURCE)."""
    src = Path(tempfile.mkdtemp(prefix="msgstream-wheel-src-"))
    try:
        shutil.copytree(root, src / "src", ignore=NOT_SOURCE)
        subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(src / "src")],
                       check=True, timeout=timeout)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    wheels = sorted(out_dir.glob("msgstream_spark-*.whl"))
    if not wheels:
        raise SystemExit(f"pack_env: no msgstream_spark wheel was built in {out_dir}")
    return wheels[-1]


def wheel_metadata(wheel: Path) -> tuple[str, str]:
    """(METADATA text, RECORD text) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        return z.read(meta).decode(), z.read(record).decode()


def runtime_requirements(metadata: str, extras: set[str], without: frozenset[str] = frozenset()) -> list[str]:
    """The wheel's Requires-Dist for ``extras`` (self-references expanded), pyspark and ``without`` (distribution
    names, e.g. ``pylance`` for jobs that write no Lance table) left out, and so what only they depend on."""
    left_out = EXCLUDED | {norm(n) for n in without}
    reqs = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    wanted, out = set(extras), []
    while True:  # until no self-reference adds an extra
        before = set(wanted)
        for req in reqs:
            spec, _, marker = req.partition(";")
            m = _EXTRA.search(marker)
            if m and m.group(1) not in wanted:
                continue
            nm = _NAME.match(spec)
            name = norm(nm.group(1)) if nm else ""
            if name == norm(PROJECT):  # e.g. msgstream-spark[kafka,pulsar]; extra == "all"
                wanted |= {e.strip() for e in (nm.group(2) or "").split(",") if e.strip()}
                continue
            if name in left_out:
                continue
            rest = _EXTRA_CLAUSE.sub(" ", marker).strip()
            line = spec.strip() + (f"; {rest}" if rest else "")
            if line not in out:
                out.append(line)
        if wanted == before:
            return out


# What the archive's content depends on besides its inputs: changed whenever ``pack`` changes what it writes, so
# an archive cached by an earlier pack_env is not reused.
PACK_FORMAT = "2: the dependencies' test suites left out"


def _without(without: frozenset[str]) -> list[str]:
    """The left-out distributions' part of a cache key (none: no part, so the keys of a plain pack stay)."""
    return [f"without {','.join(sorted(norm(n) for n in without))}"] if without else []


def cache_key(metadata: str, record: str, extras: set[str], python: str, without: frozenset[str] = frozenset()) -> str:
    """What the archive depends on: the packaged files' hashes, the requirements, extras, interpreter.

    The README (the long description in METADATA) is left out, so editing docs does not repack.
    """
    files = sorted(line for line in record.splitlines() if ".dist-info/" not in line)
    reqs = sorted(line for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    h = hashlib.sha256()
    for part in (PACK_FORMAT, "\n".join(files), "\n".join(reqs), ",".join(sorted(extras)), os.path.realpath(python),
                 sys.version, *_without(without)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def deps_key(metadata: str, extras: set[str], python: str, without: frozenset[str] = frozenset()) -> str:
    """What the dependencies' venv depends on: the requirements, extras and interpreter (not the code)."""
    reqs = sorted(line for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    h = hashlib.sha256()
    for part in ("\n".join(reqs), ",".join(sorted(extras)), os.path.realpath(python), sys.version, *_without(without)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def prune_cache(cache_dir: Path, keep: int = 2) -> None:
    """Keep the ``keep`` newest archives (each ~130 MiB) and dependency venvs (~400 MiB) in ``cache_dir``."""
    newest_first = lambda paths: sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)  # noqa: E731
    for old in newest_first(cache_dir.glob("msgstream-env-*.tar.gz"))[keep:]:
        old.unlink(missing_ok=True)
    for old in newest_first(p for p in cache_dir.glob("deps-*") if p.is_dir())[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def spark_python_path() -> str:
    """PYTHONPATH that Spark gives its Python workers (pyspark.zip, py4j), from SPARK_HOME or pyspark."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        try:
            from pyspark.find_spark_home import _find_spark_home

            home = _find_spark_home()
        except ImportError:
            return ""
    return os.pathsep.join(str(p) for p in sorted((Path(home) / "python" / "lib").glob("*.zip")))


def _pip(env_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q",
            "--no-warn-script-location"]


def make_deps_env(env_dir: Path, requirements: list[str], timeout: float) -> None:
    """A venv at ``env_dir`` holding ``requirements`` (installed by this interpreter's pip), not the project."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=timeout)
    subprocess.run(_pip(env_dir) + requirements, check=True, timeout=timeout)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


def copy_tree(src: Path, dst: Path) -> None:
    """``src`` at ``dst`` with its symlinks kept, its files hard-linked where the file system allows (the ~650 MiB
    dependencies' venv in well under a second instead of ~8 s of CPU copying it); a file installed into ``dst``
    later must replace a linked file, never write into it (pip unlinks before it writes)."""
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)


def deps_env(env_dir: Path, requirements: list[str], key: str, cache_dir: Path | None, timeout: float) -> str:
    """The dependencies' venv at ``env_dir``: copied from ``cache_dir/deps-<key>`` or made (and kept there)."""
    cached = cache_dir / f"deps-{key}" if cache_dir else None
    if cached is not None and cached.is_dir():
        copy_tree(cached, env_dir)
        os.utime(cached)  # recently used: kept by prune_cache
        return "dependencies cached"
    make_deps_env(env_dir, requirements, timeout)
    if cached is not None:
        part = cached.with_name(f"{cached.name}.{os.getpid()}.part")
        shutil.copytree(env_dir, part, symlinks=True)
        try:
            os.rename(part, cached)  # complete or absent: another process's copy may have landed first
        except OSError:
            shutil.rmtree(part, ignore_errors=True)
    return "dependencies installed"


def make_env(env_dir: Path, wheel: Path, requirements: list[str], timeout: float, key: str = "",
             cache_dir: Path | None = None) -> str:
    """A venv at ``env_dir`` holding the wheel and ``requirements``; returns how the dependencies came."""
    how = deps_env(env_dir, requirements, key, cache_dir, timeout)
    target = str(env_dir / "bin" / "python")
    subprocess.run(_pip(env_dir) + ["--no-deps", str(wheel)], check=True, timeout=timeout)
    # As on an executor: pyspark from a Spark installation's zips, nothing from the current directory.
    probe = subprocess.run([target, "-c", "import msgstream_spark.spark.datasource"], capture_output=True, text=True,
                           timeout=timeout, cwd=env_dir, env=dict(os.environ, PYTHONPATH=spark_python_path()))
    if probe.returncode != 0:
        raise SystemExit(f"pack_env: the packed environment cannot import the data source:\n{probe.stderr}")
    return how


def dependency_tests(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """A tar filter leaving out the test suites inside installed packages (``site-packages/<pkg>/**/tests``:
    pandas's, numpy's, pyarrow's, ~65 of the ~650 MiB): no import reaches them, and every driver and executor
    unpacks the archive; ``testing`` modules (``numpy.testing``) and a top-level ``tests`` stay."""
    parts = member.name.split("/")
    if "site-packages" in parts:
        inside = parts[parts.index("site-packages") + 1:]
        if "tests" in inside[1:]:
            return None
    return member


def pack(env_dir: Path, output: Path) -> None:
    """``env_dir``'s content as a gzipped tar (symlinks kept, the dependencies' test suites left out: see
    ``dependency_tests``); written to a temp name, then renamed."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + f".{os.getpid()}.part")
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for entry in sorted(env_dir.iterdir()):
            tar.add(entry, arcname=entry.name, filter=dependency_tests)
    os.replace(tmp, output)


def build(output: Path, extras: set[str], wheel: Path | None = None, cache_dir: Path | None = None,
          timeout: float = 600, without: frozenset[str] = frozenset()) -> Path:
    """Build (or take from the cache) the archive, the distributions ``without`` left out; returns the path
    written."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="msgstream-pack-") as tmp:
        wheel = wheel or build_wheel(Path(tmp) / "wheel", timeout=timeout)
        metadata, record = wheel_metadata(wheel)
        key = cache_key(metadata, record, extras, sys.executable, without)
        cached = cache_dir / f"msgstream-env-{key}.tar.gz" if cache_dir else None
        if cached is not None and cached.is_file():
            src, how = cached, "cached"
            os.utime(cached)  # recently used: kept by prune_cache
        else:
            env_dir = Path(tmp) / "env"
            deps = make_env(env_dir, wheel, runtime_requirements(metadata, extras, without), timeout,
                            deps_key(metadata, extras, sys.executable, without), cache_dir)
            src, how = cached or output, f"built ({deps})"
            pack(env_dir, src)
            if cache_dir is not None:
                prune_cache(cache_dir)
        if src != output:  # linked where it can be: nothing writes into an archive (a new one replaces it)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.unlink(missing_ok=True)
            _link_or_copy(str(src), str(output))
    size = output.stat().st_size / 2**20
    print(f"pack_env: {how} {output} ({size:.0f} MiB, {time.monotonic() - t0:.1f} s)", file=sys.stderr)
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pack_env", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", "-o", default="dist/msgstream-env.tar.gz", help="archive to write")
    p.add_argument("--extras", default="kafka,pulsar", help="extras to install (default kafka,pulsar)")
    p.add_argument("--wheel", help="an msgstream-spark wheel to pack (default: build one from this checkout)")
    p.add_argument("--cache-dir", help="reuse archives kept here, keyed by the wheel's content, and the dependencies' "
                                       "venv, keyed by the requirements")
    p.add_argument("--without", default="", help="distributions the jobs do not use, left out with what only they "
                                                  "need (comma-separated; e.g. pylance: ~220 MiB unpacked)")
    args = p.parse_args(argv)
    extras = {e.strip() for e in args.extras.split(",") if e.strip()}
    without = frozenset(w.strip() for w in args.without.split(",") if w.strip())
    build(Path(args.output).resolve(), extras, Path(args.wheel).resolve() if args.wheel else None,
          Path(args.cache_dir).resolve() if args.cache_dir else None, without=without)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
