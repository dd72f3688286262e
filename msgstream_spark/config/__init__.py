"""Configuration: YAML with Milvus's keys, backend selection and the factory."""

from msgstream_spark.config.factory import Factory
from msgstream_spark.config.loader import Config, is_secret_key, mask_value

__all__ = ["Config", "Factory", "is_secret_key", "mask_value"]
