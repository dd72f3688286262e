"""Trusting the mirror: verify against Milvus, freshness (watermarks, status), the change history."""
