"""Pulsar backend on pulsar-client (imported lazily: only when this backend is built)."""
