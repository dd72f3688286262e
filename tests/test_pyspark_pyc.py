"""tests/fixtures/pyspark_pyc.py: the venv's pyspark.zip rewritten with compiled modules and without pyspark's own
test packages (on a small zip of the same shape, not the venv's)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile

from tests.fixtures.pyspark_pyc import compile_zip, compiled, is_test


def test_the_zip_loses_its_test_packages_and_gains_pycs_that_import(tmp_path):
    z = tmp_path / "pkg.zip"
    with zipfile.ZipFile(z, "w") as out:
        out.writestr("pkg/__init__.py", "")
        out.writestr("pkg/mod.py", "VALUE = 42\n")
        out.writestr("pkg/tests/__init__.py", "")
        out.writestr("pkg/tests/test_mod.py", "import pkg.mod\n")
        out.writestr("pkg/sql/tests/connect/test_x.py", "")
        out.writestr("pkg/testing/__init__.py", "")
        out.writestr("pkg/testing/utils.py", "HELPER = 1\n")
        out.writestr("pkg/data/tests.json", "{}")  # a file named tests, not in a tests package: kept
    assert not compiled(z)
    assert compile_zip(z) == 2  # pkg/__init__.py, pkg/mod.py (pkg.testing: kept, not compiled)
    names = set(zipfile.ZipFile(z).namelist())
    assert names == {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc", "pkg/testing/__init__.py",
                     "pkg/testing/utils.py", "pkg/data/tests.json"}
    assert compiled(z)
    with zipfile.ZipFile(z) as f:
        assert f.read("pkg/mod.pyc")[:4] == importlib.util.MAGIC_NUMBER
    done = subprocess.run([sys.executable, "-c", "import pkg.mod, pkg.testing.utils; print(pkg.mod.VALUE)"],
                          env={"PYTHONPATH": str(z)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr


def test_what_counts_as_a_test_package():
    assert is_test("pyspark/sql/tests/test_udf.py") and is_test("pyspark/tests/__init__.py")
    assert not is_test("pyspark/testing/utils.py") and not is_test("pyspark/sql/worker/plan_data_source_read.py")
    assert not is_test("tests")  # a file, not a package
