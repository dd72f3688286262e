"""msgstream-spark: Milvus message streams (msgstream) for Python and Spark."""

__version__ = "0.1.0"
