"""The Spark-free sink core: plan, encode, wire, dedupe, task (used by the Spark writers and the CLI)."""
