"""What Spark pickles of a database job's batch (issue #44: the driver's CPU per batch): each ``mapInArrow``
function (the writing tasks', their ``split``, the planning tasks') is pickled at every batch, carrying every
table's spec. They are instances of importable classes, pickled as their fields and a reference to their class;
they were closures, which cloudpickle pickles by value (code, globals), scanning every module the driver imported
for each module a closure refers to (~18 ms a ``mapInArrow`` in the profile, four a batch)."""

from __future__ import annotations

import io
import pickle

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


class _Stub:
    """What every global a pickle names is read as (nothing of it runs: a broadcast is not read on the driver)."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __setstate__(self, state) -> None:
        pass


class _Names(pickle.Unpickler):
    """An unpickler that records the globals a pickle names, each read as a ``_Stub``."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.named: list[str] = []

    def find_class(self, module: str, name: str):
        self.named.append(f"{module}.{name}")
        return _Stub


def test_a_batchs_task_functions_are_pickled_without_code(spark, local_env, tmp_path, monkeypatch):
    from pyspark.serializers import CloudPickleSerializer

    from msgstream_spark.jobs import mirror

    shipped = []
    frame = type(spark.range(1))  # the session's DataFrame class (Spark 4: pyspark.sql.classic's)
    real = frame.mapInArrow

    def caught(df, func, schema, *a, **kw):
        shipped.append(func)
        return real(df, func, schema, *a, **kw)

    monkeypatch.setattr(frame, "mapInArrow", caught)
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mpick") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in ((51, "a"), (52, "b"), (53, "c")):
                log.create("db1", name, cid)
                log.insert(cid, range(cid * 10, cid * 10 + 8))
            log.tick()
        finally:
            log.close()
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    mirror.run(mirror.build_parser().parse_args(argv), spark)
    for cid, name in ((51, "a"), (52, "b"), (53, "c")):
        assert sorted(table_rows(root / "db1" / name)) == list(range(cid * 10, cid * 10 + 8))
    ours = [f for f in shipped if type(f).__module__.startswith("msgstream_spark")
            or getattr(f, "__module__", "").startswith("msgstream_spark")]
    assert len(ours) >= 2, shipped  # the batch's writing and planning tasks' functions
    for f in ours:
        names = _Names(CloudPickleSerializer().dumps(f))
        names.load()
        by_value = [n for n in names.named if "cloudpickle" in n]  # a function or class rebuilt from its code
        assert by_value == [], (f, by_value)
