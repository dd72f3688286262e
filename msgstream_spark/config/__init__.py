"""Configuration: YAML with Milvus's keys and backend selection (pure data: no backend imports); the one
definition of a secret and its maskers (:mod:`.secrets`)."""

from msgstream_spark.config.loader import Config
from msgstream_spark.config.secrets import MASK, is_secret, mask_command, mask_mapping, mask_text, mask_value

__all__ = ["MASK", "Config", "is_secret", "mask_command", "mask_mapping", "mask_text", "mask_value"]
