"""The jobs' early check of a relative ``spark.pyspark.python`` on the driver (no Spark needed)."""

from __future__ import annotations

import sys

import pytest

from msgstream_spark.errors import MsgStreamError
from msgstream_spark.jobs._common import check_driver_python


def test_a_relative_python_missing_on_the_driver_says_what_to_unpack_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MsgStreamError) as err:
        check_driver_python("./environment/bin/python")
    text = str(err.value)
    assert "spark.pyspark.python" in text and f"{tmp_path}/environment/bin/python does not exist" in text
    assert "mkdir -p environment && tar -xzf <archive> -C environment" in text


@pytest.mark.parametrize("python", ["python3", sys.executable, "./environment/bin/python"])
def test_names_on_path_absolute_paths_and_present_relative_paths_pass(tmp_path, monkeypatch, python):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "environment" / "bin").mkdir(parents=True)
    (tmp_path / "environment" / "bin" / "python").write_text("")
    check_driver_python(python)
