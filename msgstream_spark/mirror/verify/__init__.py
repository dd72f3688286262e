"""Checking a mirrored table against Milvus (compare, digest, run, repair) and its freshness (status)."""
