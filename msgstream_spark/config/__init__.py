"""Configuration: YAML with Milvus's keys and backend selection (pure data: no backend imports)."""

from msgstream_spark.config.loader import Config, is_secret_key, mask_value

__all__ = ["Config", "is_secret_key", "mask_value"]
