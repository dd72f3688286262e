"""tests/cluster's own fixture: the module's one spark-submit application (tests/cluster/cluster_app.py)."""

from tests.cluster.cluster_app import cluster_app  # noqa: F401 - a fixture
