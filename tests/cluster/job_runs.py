"""A spark-submit app that runs job files one after the other in one application, each as ``spark-submit FILE
ARGS...`` runs it: ``FILE`` executed as ``__main__`` (``runpy``) with ``sys.argv`` = ``[FILE, *ARGS]`` and its
directory first on ``sys.path``, as ``python FILE`` has it. One driver and its executors for several jobs.

Run by tests/cluster/test_cluster_jobs.py: ``job_runs.py FILE ARGS... [-- FILE ARGS...]...``; after each job
a line ``JOB-END <index> <exit code>`` on stdout; the app stops at the first job that does not exit 0.
"""

import os
import runpy
import sys


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


def split_runs(argv: list[str]) -> list[list[str]]:
    """``A... -- B... -- C...``: the ``--``-separated parts, each one run's arguments (also mirror_runs.py's)."""
    runs, part = [], []
    for a in argv:
        if a == "--":
            runs.append(part)
            part = []
        else:
            part.append(a)
    runs.append(part)
    return runs


def main(argv: list[str]) -> int:
    for i, (path, *args) in enumerate(split_runs(argv)):
        rc = run_job(path, args)
        sys.stderr.flush()
        print(f"JOB-END {i} {rc}", flush=True)
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as the jobs: delta-rs can abort the process at interpreter exit (delta-rs issue 2184)
