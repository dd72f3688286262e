"""The table formats and their commit protocol:
Delta (delta-rs + this project's log writer) and Iceberg (pyiceberg), one writer at a time."""
