"""The merge-on-read write path: what tasks write and look up, and the plan the driver commits."""
