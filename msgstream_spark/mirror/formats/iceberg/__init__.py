"""The mirror's table as Apache Iceberg: the catalog, snapshots with position deletes."""
