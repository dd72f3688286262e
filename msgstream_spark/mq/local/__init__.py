"""The embedded backend: a SQLite log in WAL mode (Milvus's RocksMQ role), safe across processes."""
