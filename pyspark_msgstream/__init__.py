"""Auto-registration of the ``msgstream`` data source: Spark 4 registers every installed
top-level ``pyspark_*`` module's ``DefaultSource``.

Spark finds this module by listing sys.path with ``pkgutil.iter_modules()`` in a Python worker
(pyspark/sql/worker/lookup_data_sources.py), so it must be a real directory on sys.path, not a
name an import hook resolves: a wheel installs it into site-packages, and the editable install
puts the project root on sys.path (``package-dir`` in pyproject.toml says why).
"""

from msgstream_spark.spark.datasource import MsgStreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
