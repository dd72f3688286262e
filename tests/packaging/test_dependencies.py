"""The installed dependencies are versions pyspark supports (no warning on every Spark start)."""

from __future__ import annotations

import warnings
from importlib.metadata import requires


def test_pandas_is_a_version_pyspark_supports():
    """pyspark 4.x "does not yet fully support pandas >= 3.0.0" and says so on every start (issue #19)."""
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()
    pins = [r for r in requires("msgstream-spark") or [] if r.split(">")[0].split("<")[0].strip() == "pandas"]
    assert pins and all("<3" in p.replace(" ", "") for p in pins), pins  # the pin keeps a fresh install there
