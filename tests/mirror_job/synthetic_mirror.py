"""What a mirror of ``msgstream publish --synthetic`` runs must hold, and plain readers of the table.

The expected rows come from the CLI's documented generator (``cli.data.synthetic_batch``: a run's rows are
seeded by its ``--start``, so publishing a key range again changes its vectors: an update) and the documented
``--delete-fraction`` (every (1/f)-th published key deleted afterwards); the table is read by delta-rs's
DataFusion scan or pyiceberg, not by this project's table code.
"""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.cli.data import synthetic_batch

DIM = 4
# (start, rows, delete fraction): 200 rows with every 10th deleted; 50..69 published again (an update of
# live rows, and 50 and 60 back after their delete); 100..109 published again and deleted
PUBLISHES = [(0, 200, 0.1), (50, 20, 0.0), (100, 10, 1.0)]


def publish_argv(cfg: str, channels: list[str], collection: str, start: int, rows: int, frac: float) -> list[str]:
    return ["publish", "--config", cfg, "--channels", ",".join(channels), "--synthetic", str(rows), "--start",
            str(start), "--dim", str(DIM), "--delete-fraction", str(frac), "--collection", collection,
            "--no-progress"]


def expected(publishes) -> dict[int, tuple]:
    """{pk: (category, score, vec)} after ``publishes`` in order."""
    rows: dict[int, tuple] = {}
    for start, n, frac in publishes:
        for r in synthetic_batch(start, n, DIM).to_pylist():
            rows[r["pk"]] = (r["category"], r["score"], r["vec"])
        if frac:
            for pk in range(start, start + n, round(1 / frac)):
                rows.pop(pk, None)
    return rows


def as_rows(t: pa.Table) -> dict[int, tuple]:
    out: dict[int, tuple] = {}
    for r in t.select(["pk", "category", "score", "vec"]).to_pylist():
        assert r["pk"] not in out, f"pk {r['pk']} twice in the table"
        out[r["pk"]] = (r["category"], r["score"], r["vec"])
    return out


def read_delta(location: str) -> dict[int, tuple]:
    """The table through delta-rs's DataFusion scan (reads deletion vectors)."""
    import deltalake

    dt = deltalake.DeltaTable(location)
    return as_rows(pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()))


def delta_files(location: str) -> list[str]:
    """The data files the Delta table's current version references, from delta-rs's add actions."""
    import deltalake

    return deltalake.DeltaTable(location).get_add_actions(flatten=True).column("path").to_pylist()


def read_iceberg(location: str, collection: str) -> dict[int, tuple]:
    """The table through pyiceberg's scan (reads position deletes), from the job's default SQLite catalog."""
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("msgstream", uri=f"sqlite:///{location}_catalog.sqlite", warehouse=f"file://{location}")
    return as_rows(cat.load_table(("msgstream", collection)).scan().to_arrow())


def iceberg_files(location: str, collection: str) -> list[str]:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("msgstream", uri=f"sqlite:///{location}_catalog.sqlite", warehouse=f"file://{location}")
    return [t.file.file_path for t in cat.load_table(("msgstream", collection)).scan().plan_files()]
