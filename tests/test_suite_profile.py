"""The suite profile (tests/fixtures/suite_profile.py): group wall times, worker busy times, the critical path."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.fixtures.suite_profile import NO_GROUP, Profile, group_of, render

ROOT = Path(__file__).resolve().parents[1]


def test_groups_workers_and_the_critical_path_from_reports():
    p = Profile()
    # gw0: group a (two tests, 10 s apart), then an ungrouped test; gw1: group b, which ends last
    p.add("t.py::x@a", "gw0", 100.0, 101.0)
    p.add("t.py::x@a", "gw0", 101.0, 104.0)  # the same test's next phase
    p.add("t.py::y@a", "gw0", 110.0, 112.0)
    p.add("t.py::z", "gw0", 112.0, 113.0)
    p.add("t.py::w@b", "gw1", 101.0, 130.0)
    p.add_cpu("gw1", {"b": 55.5})
    s = p.summary({"a": 10.0, "b": 60.0}.get)
    by = {(g["group"], g["worker"]): g for g in s["groups"]}
    a, b, none = by["a", "gw0"], by["b", "gw1"], by[NO_GROUP, "gw0"]
    assert (a["tests"], a["start"], a["end"], a["wall"], a["busy"], a["cpu"]) == (2, 0.0, 12.0, 12.0, 6.0, None)
    assert (b["tests"], b["wall"], b["busy"], b["cpu"]) == (1, 29.0, 29.0, 55.5)
    assert none["tests"] == 1 and s["tests_wall"] == 30.0
    workers = {w["worker"]: w for w in s["workers"]}
    assert (workers["gw0"]["busy"], workers["gw0"]["end"], workers["gw0"]["idle"]) == (7.0, 13.0, 6.0)
    assert workers["gw0"]["groups"] == ["a"]  # the ungrouped tests are not a group of the path
    assert s["critical_path"] == {"worker": "gw1", "end": 30.0, "groups": ["b"]}
    assert (a["budget"], b["budget"], none["budget"]) == (10.0, 60.0, None)
    text = render(s)
    assert "critical path: gw1, its last test ends at 30.0 s; its groups in order:" in text and text[-1] == "  b"
    assert "tests' wall time 30.0 s" in text[0]
    assert [ln.split()[0] for ln in text if "!" in ln] == ["a"]  # 12 s of wall: over its 10 s budget


def test_a_group_is_the_xdist_suffix_or_the_mark_seen_in_this_process():
    assert group_of("tests/a.py::t[x@y]@spark-a", {}) == "spark-a"
    assert group_of("tests/a.py::t[1]@tests/a.py", {}) == "tests/a.py"  # a module's group (tests/conftest.py)
    assert group_of("tests/a.py::t[x@y]", {}) == NO_GROUP  # an @ inside a parameter id is not a group
    assert group_of("tests/a.py::t", {"tests/a.py::t": "milvus"}) == "milvus"


def test_under_xdist_the_controller_prints_what_the_workers_ran(pytester, monkeypatch):
    """A real ``-n 2 --dist loadgroup`` run of a tiny suite: two groups on two workers, each group's tests, its
    wall time (a test's sleep is inside it) and its CPU (a test that spins a child process), in the table."""
    pytester.makepyfile(test_two_groups="""
        import subprocess, sys, time
        import pytest

        @pytest.mark.xdist_group("slowgroup")
        @pytest.mark.parametrize("i", range(2))
        def test_slow(i):
            time.sleep(0.6)

        @pytest.mark.xdist_group("cpugroup")
        def test_cpu():
            # 1.5 s of CPU, then alive and idle for 2 s: the worker samples its tree every second, so a sample
            # sees the child's whole CPU (one that ended right after spinning could lose up to a second of it)
            subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time() + 1.5\\n"
                            "while time.process_time() < t: pass\\ntime.sleep(2)"], check=True)

        def test_free():
            pass
    """)
    out = pytester.path / "profile.json"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "tests.fixtures.suite_profile", "-p", "xdist", "-n", "2",
                                           "--dist", "loadgroup", f"--suite-profile-json={out}", "-q",
                                           timeout=120)
    result.assert_outcomes(passed=4)
    for line in ("slowgroup *gw? *2 *", "cpugroup *gw? *1 *"):  # in any order: the longest group first
        result.stdout.fnmatch_lines(["*suite profile: xdist groups and workers*", line,
                                     "critical path: gw?, its last test ends at *"])
    s = json.loads(out.read_text())
    by = {g["group"]: g for g in s["groups"]}
    assert by["slowgroup"]["worker"] != by["cpugroup"]["worker"]
    assert by["slowgroup"]["wall"] >= 1.2 and by["slowgroup"]["busy"] >= 1.2
    assert by["cpugroup"]["cpu"] >= 1.4  # the child's CPU, sampled while it lived
    assert {w["worker"] for w in s["workers"]} == {"gw0", "gw1"}


def test_the_budget_and_long_test_tables_name_groups_and_tests_that_exist():
    """tests/conftest.py's BUDGETS and LONG_TESTS order the run: an entry whose module or test was renamed would
    stop ordering anything without a word."""
    import re

    from tests.conftest import BUDGETS, LONG_TESTS, SHARED_DIRECTORY, SHARED_SERVERS, expected_seconds

    named = {*SHARED_DIRECTORY.values(), *SHARED_SERVERS.values()}
    stale = [g for g in BUDGETS if g not in named and not (ROOT / g).is_file()]
    for prefix in LONG_TESTS:
        module, _, test = prefix.partition("::")
        path = ROOT / module
        if not path.is_file() or (test and not re.search(rf"^def {re.escape(test)}", path.read_text(), re.M)):
            stale.append(prefix)
    assert stale == []
    assert expected_seconds("tests/bench/test_bench_scripts.py::test_x", None) == LONG_TESTS[
        "tests/bench/test_bench_scripts.py"]
    assert expected_seconds("tests/cli/test_cli.py::test_x", None) == 0.0
    assert expected_seconds("x", "tests/milvus_real/test_mirror.py") == BUDGETS["tests/milvus_real/test_mirror.py"]
