"""tools/pack_env.py's requirement selection and cache key (no packing, no Spark)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

PACK_ENV = Path(__file__).resolve().parents[2] / "tools" / "pack_env.py"
_spec = importlib.util.spec_from_file_location("pack_env", PACK_ENV)
pack_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack_env)

METADATA = """Metadata-Version: 2.4
Name: msgstream-spark
Requires-Dist: pyspark<5,>=4.2
Requires-Dist: pyarrow>=15
Requires-Dist: confluent-kafka>=2.3; extra == "kafka"
Requires-Dist: pulsar-client>=3.4; extra == "pulsar"
Requires-Dist: tomli; python_version < "3.11" and extra == "kafka"
Requires-Dist: msgstream-spark[kafka,pulsar]; extra == "all"
Requires-Dist: pytest>=8; extra == "dev"

A long description.
"""


@pytest.mark.parametrize("extras, expected", [
    (set(), ["pyarrow>=15"]),
    ({"kafka"}, ["pyarrow>=15", "confluent-kafka>=2.3", 'tomli; python_version < "3.11"']),
    ({"all"}, ["pyarrow>=15", "confluent-kafka>=2.3", "pulsar-client>=3.4", 'tomli; python_version < "3.11"']),
])
def test_requirements_follow_the_extras_and_leave_pyspark_to_the_workers(extras, expected):
    assert pack_env.runtime_requirements(METADATA, extras) == expected


def test_without_leaves_a_distribution_out_and_keys_its_own_archive():
    """``--without pylance``: the requirement left out (so are what only it needs: pip never sees it), names
    compared as pip does; the archive and the dependencies' venv keyed apart from a full pack's, a full pack's keys
    as they were."""
    meta = METADATA.replace("Requires-Dist: pyarrow>=15", "Requires-Dist: pyarrow>=15\nRequires-Dist: pylance>=14")
    assert pack_env.runtime_requirements(meta, {"kafka"}) == [
        "pyarrow>=15", "pylance>=14", "confluent-kafka>=2.3", 'tomli; python_version < "3.11"']
    for without in ({"pylance"}, {"PyLance"}):
        assert pack_env.runtime_requirements(meta, {"kafka"}, frozenset(without)) == [
            "pyarrow>=15", "confluent-kafka>=2.3", 'tomli; python_version < "3.11"']
    record = "msgstream_spark/__init__.py,sha256=abc,10\n"
    py = "/usr/bin/python3"
    assert pack_env.cache_key(meta, record, {"kafka"}, py, frozenset({"pylance"})) != pack_env.cache_key(
        meta, record, {"kafka"}, py)
    assert pack_env.deps_key(meta, {"kafka"}, py, frozenset({"pylance"})) != pack_env.deps_key(meta, {"kafka"}, py)
    assert pack_env.deps_key(meta, {"kafka"}, py, frozenset()) == pack_env.deps_key(meta, {"kafka"}, py)


def test_the_cache_key_follows_the_code_and_the_requirements_not_the_readme():
    record = "msgstream_spark/__init__.py,sha256=abc,10\nmsgstream_spark-0.1.0.dist-info/METADATA,sha256=x,5\n"
    key = pack_env.cache_key(METADATA, record, {"kafka"}, "/usr/bin/python3")
    readme = METADATA.replace("A long description.", "Another one.")
    meta_line = record.replace("sha256=x", "sha256=y")
    assert pack_env.cache_key(readme, meta_line, {"kafka"}, "/usr/bin/python3") == key
    assert pack_env.cache_key(METADATA, record.replace("abc", "abd"), {"kafka"}, "/usr/bin/python3") != key
    assert pack_env.cache_key(METADATA.replace(">=15", ">=16"), record, {"kafka"}, "/usr/bin/python3") != key
    assert pack_env.cache_key(METADATA, record, {"kafka", "pulsar"}, "/usr/bin/python3") != key


def test_the_dependencies_key_follows_the_requirements_not_the_code():
    key = pack_env.deps_key(METADATA, {"kafka"}, "/usr/bin/python3")
    assert pack_env.deps_key(METADATA.replace("A long description.", "Another one."), {"kafka"},
                             "/usr/bin/python3") == key
    assert pack_env.deps_key(METADATA.replace(">=15", ">=16"), {"kafka"}, "/usr/bin/python3") != key
    assert pack_env.deps_key(METADATA, {"kafka", "pulsar"}, "/usr/bin/python3") != key
    assert pack_env.deps_key(METADATA, {"kafka"}, "/usr/bin/python3.12") != key


def test_a_cached_dependencies_venv_is_copied_not_installed_again(tmp_path):
    cache = tmp_path / "cache"
    (cache / "deps-k1" / "lib").mkdir(parents=True)
    (cache / "deps-k1" / "lib" / "dep.py").write_text("x = 1\n")
    # A requirement no index has: installing it would fail, so only the copy can succeed.
    how = pack_env.deps_env(tmp_path / "env", ["msgstream-no-such-dependency==0"], "k1", cache, timeout=60)
    assert how == "dependencies cached"
    assert (tmp_path / "env" / "lib" / "dep.py").read_text() == "x = 1\n"


def test_the_checkouts_environments_are_not_sources():
    """`make test` makes .venv-rest and .node-azurite in the checkout: a wheel build must not copy them."""
    names = [".venv", ".venv-rest", ".node-azurite", ".git", "msgstream_spark", "tests", "pyproject.toml"]
    assert pack_env.NOT_SOURCE("/checkout", names) == {".venv", ".venv-rest", ".node-azurite", ".git"}


def test_the_cached_dependencies_are_linked_and_a_replaced_file_leaves_the_cache_alone(tmp_path):
    cached = tmp_path / "cache" / "deps-k1"
    (cached / "lib").mkdir(parents=True)
    (cached / "lib" / "dep.py").write_text("x = 1\n")
    (cached / "bin").mkdir()
    (cached / "bin" / "python").symlink_to("/usr/bin/python3")
    pack_env.deps_env(tmp_path / "env", ["msgstream-no-such-dependency==0"], "k1", tmp_path / "cache", timeout=60)
    dep = tmp_path / "env" / "lib" / "dep.py"
    assert dep.stat().st_ino == (cached / "lib" / "dep.py").stat().st_ino
    assert os.readlink(tmp_path / "env" / "bin" / "python") == "/usr/bin/python3"
    dep.unlink()  # as pip replaces a file
    dep.write_text("x = 2\n")
    assert (cached / "lib" / "dep.py").read_text() == "x = 1\n"


def test_the_archive_leaves_out_the_dependencies_test_suites_only(tmp_path):
    import tarfile

    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    kept = ["pandas/__init__.py", "numpy/testing/__init__.py", "tests/__init__.py", "pandas/_libs/tests.py"]
    dropped = ["pandas/tests/__init__.py", "pandas/tests/frame/test_api.py", "numpy/_core/tests/test_x.py"]
    for rel in kept + dropped:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x = 1\n")
    (tmp_path / "env" / "bin").mkdir()
    (tmp_path / "env" / "bin" / "python").symlink_to("/usr/bin/python3")
    pack_env.pack(tmp_path / "env", tmp_path / "env.tar.gz")
    with tarfile.open(tmp_path / "env.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"lib/python3.11/site-packages/{rel}" for rel in kept} <= names
    assert not [n for n in names if "/tests/" in n.replace("site-packages/tests/", "")]
    assert "lib/python3.11/site-packages/pandas/tests" not in names and "bin/python" in names
