"""A spark-submit app that runs jobs one after the other in one application, as the test sends them: one driver and
its executors (and so one unpacking of the shipped environment by each) for every job of
tests/cluster/test_cluster_jobs.py (tests/cluster/cluster_app.py starts it and sends the steps).

``job_runs.py DIR``: the test writes its messages as files ``DIR/msg-<n>.json`` (n = 0, 1, ...; each complete when
it appears: written under another name, then renamed), as spark-submit gives the driver's Python no input of the
caller's. A message is a step (JSON); after each step a line ``JOB-END <index> <exit code>`` on stdout:

- ``{"file": FILE, "args": [...], "env": {...}}``: ``FILE`` run as ``spark-submit FILE ARGS...`` runs it
  (``runpy``: executed as ``__main__`` with ``sys.argv`` = ``[FILE, *ARGS]`` and its directory first on
  ``sys.path``, as ``python FILE`` has it), ``env``'s variables set in the driver's environment while it runs;
- ``{"mirror": [...], "env": {...}}``: the mirror job (``msgstream_spark.jobs.mirror``, the file ``job-path mirror``
  prints) run with these arguments through its ``run``, as its ``main`` does but without the session's stop and
  the process's exit that end ``main``; its summary printed as one line ``SUMMARY <json>``;
- ``{"probe": PYTHON}``: where executors find msgstream_spark, with the shipped environment and with the worker's
  bare interpreter ``PYTHON`` (``run_probe``), as one line ``PROBE <json>``; it leaves the context pointing at
  ``PYTHON``: the last step;
- ``{"stop": true}``, acted on as soon as it is read, while a job runs: the session's streaming queries are stopped
  (the end of a processing-time job, as ``query.stop()`` in a job run in-process);
- ``{"end": true}``: no more steps, the app ends (as it does when no message came for ``IDLE`` seconds).
"""

import json
import os
import queue
import runpy
import sys
import threading
import time


class environment:
    """``env``'s variables in the driver's environment while a step runs, the earlier values back after it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.saved = env, {k: os.environ.get(k) for k in env}

    def __enter__(self) -> None:
        os.environ.update(self.env)

    def __exit__(self, *exc) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_job(path: str, args: list[str]) -> int:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:  # the job files end with ``raise SystemExit(main())``
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_mirror(args: list[str]) -> int:
    import logging

    from msgstream_spark.jobs import mirror

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="mirror: %(message)s")
    summary = mirror.run(mirror.build_parser().parse_args(args))
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    return 0


def where(_):
    """A task's report: its interpreter, working directory and where ``import msgstream_spark`` finds it."""
    import os
    import sys

    try:
        import msgstream_spark.spark.datasource as ds

        found = ds.__file__
    except ImportError as exc:
        found = f"ImportError: {exc}"
    yield {"python": sys.executable, "realpath": os.path.realpath(sys.executable), "cwd": os.getcwd(),
           "msgstream_spark": found}


def run_probe(bare_python: str) -> dict:
    """One task in the app's Python (the shipped environment), then one in ``bare_python`` (the context keeps
    pointing at it: run last)."""
    from pyspark.sql import SparkSession

    sc = SparkSession.getActiveSession().sparkContext
    shipped = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    sc.pythonExec = bare_python  # the worker's own interpreter for the next task
    bare = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    return {"shipped": shipped, "bare": bare}


def stop_streams() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()  # the app's one session (the active one is per thread)
    for q in spark.streams.active:
        print(f"job_runs: stopping the streaming query {q.name}", file=sys.stderr, flush=True)
        q.stop()


IDLE = 1800.0  # seconds without a message after which the app ends (its test is gone)


def read_steps(where: str, steps: queue.Queue) -> None:
    """The messages in ``where`` into ``steps`` in order (None at the end); a stop acted on at once."""
    n, last = 0, time.monotonic()
    while time.monotonic() - last < IDLE:
        path = os.path.join(where, f"msg-{n}.json")
        if not os.path.exists(path):
            time.sleep(0.2)
            continue
        with open(path) as f:
            step = json.load(f)
        n, last = n + 1, time.monotonic()
        if step.get("end"):
            break
        if step.get("stop"):
            stop_streams()
        else:
            steps.put(step)
    steps.put(None)


def run_step(step: dict) -> int:
    if "probe" in step:
        print("PROBE " + json.dumps(run_probe(step["probe"])), flush=True)
        return 0
    with environment(step.get("env", {})):
        if "mirror" in step:
            return run_mirror([str(a) for a in step["mirror"]])
        return run_job(step["file"], [str(a) for a in step.get("args", [])])


def main(where: str) -> int:
    steps: queue.Queue = queue.Queue()
    threading.Thread(target=read_steps, args=(where, steps), daemon=True).start()
    i = 0
    while (step := steps.get()) is not None:
        try:
            rc = run_step(step)
        except Exception as exc:  # noqa: BLE001 - the test reads the exit code and the traceback
            import traceback

            traceback.print_exc()
            rc = 1
            print(f"job_runs: step {i} failed: {exc}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        print(f"JOB-END {i} {rc}", flush=True)
        i += 1
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1])
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        SparkSession.getActiveSession().stop()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as the jobs: delta-rs can abort the process at interpreter exit (delta-rs issue 2184)
