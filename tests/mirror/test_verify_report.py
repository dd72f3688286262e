"""verify's ``--report-table``: each run's keys appended to a Delta table of the mirror's own (through
``formats.registry.append_report``), a clean run recorded as one row of kind ``none``."""

from __future__ import annotations

import deltalake

from msgstream_spark.mirror.verify.compare import Result
from msgstream_spark.mirror.verify.run import write_report


def test_each_run_appends_its_keys_and_a_clean_run_one_row(tmp_path):
    where = str(tmp_path / "report")
    write_report(Result([{"kind": "missing", "pk": 7}, {"kind": "extra", "pk": 9}], [{"kind": "in_flux", "pk": 3}],
                        {}), where, "run-1")
    write_report(Result([], [], {}), where, "run-2")
    got = deltalake.DeltaTable(where).to_pyarrow_table().sort_by([("run_id", "ascending"), ("pk", "ascending")])
    rows = [(r["run_id"], r["kind"], r["pk"], r["equal"]) for r in got.to_pylist()]
    assert rows == [("run-1", "in_flux", "3", False), ("run-1", "missing", "7", False),
                    ("run-1", "extra", "9", False), ("run-2", "none", None, True)]
