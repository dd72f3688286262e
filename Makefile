# msgstream-spark: `make demo` runs the main job on the embedded backend, `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(VPY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(VPY))
# Python caches the project's compiled modules (__pycache__/, git-ignored) even where the shell asks it not to: every
# Spark Python worker, job and CLI process of the suite would otherwise compile msgstream_spark again (~0.15 s of
# CPU each) and every xdist worker rewrite the tests' asserts again (~6 s each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: test test-fast demo lint bench chaos check-java install clean cluster-env postgres rest-catalog

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required by Spark but 'java' was not found on PATH (install a JDK 17+, e.g. apt-get install openjdk-17-jre-headless)" >&2; exit 1; }

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# A class-data-sharing archive of Spark's classes for the suite's JVMs (tests/fixtures/jvm_cds.py): ~25% less CPU
# for each JVM's start; made once per venv (~30 s), the suite runs without it too.
CDS := $(VENV)/spark-cds.jsa
$(CDS): $(STAMP)
	$(VPY) -m tests.fixtures.jvm_cds

# pyspark.zip with compiled modules and without pyspark's own tests (tests/fixtures/pyspark_pyc.py): every Python
# process Spark starts (its workers, a Python data source's planners, each streaming query's source runner) imports
# pyspark from that zip, which Python otherwise compiles from source at each start (~0.5 s of CPU more a process),
# and reads its directory again at its first task (~0.06 s more with the tests); made once per venv (~3 s).
PYSPARK_PYC := $(VENV)/.pyspark-pyc
$(PYSPARK_PYC): $(STAMP) tests/fixtures/pyspark_pyc.py
	$(VPY) -m tests.fixtures.pyspark_pyc
	@touch $(PYSPARK_PYC)

install: check-java $(STAMP) $(CDS) $(PYSPARK_PYC)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The full suite in TEST_WORKERS pytest-xdist processes. `--dist loadgroup` keeps the tests that share an expensive
# process (a SparkSession, the real Milvus, the standalone cluster, the Spark Connect server) on one worker
# (tests/conftest.py's xdist groups, handed out longest first: GROUP_ORDER); `--durations` prints the slowest tests.
# A test is re-run once (pytest-rerunfailures) only when Spark gave up on a new Python worker process connecting
# back: Spark waits a fixed 10 s for it (PythonWorkerFactory.createSimpleWorker, not configurable), which a Python
# start on a loaded 2-core machine can exceed; any other failure fails the run. The summary lists re-runs (R). TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 3
test: check-java postgres rest-catalog azurite $(STAMP) $(CDS) $(PYSPARK_PYC)
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 \
	  --reruns 1 --only-rerun "Python worker failed to connect back" $(PYTEST_ARGS)

# The SQL-catalog tests start a real PostgreSQL server (tests/fixtures/postgres_env.py): Debian's package, installed
# here when it is missing and apt-get can run (as root, non-interactively); elsewhere those tests skip, saying why.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's postgresql for the SQL-catalog tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null \
	  || echo "warning: apt-get could not install postgresql: the SQL-catalog tests will skip"; \
	  else echo "note: no PostgreSQL server (/usr/lib/postgresql/*/bin): the SQL-catalog tests will skip"; fi; }

# The REST-catalog tests run lakana-server (PyPI; tests/fixtures/rest_catalog_env.py), the one Iceberg REST catalog
# server found that needs no JVM or Docker, in a venv of its own (its botocore pin conflicts with moto's); if it
# cannot be installed, those tests skip, saying why.
REST_VENV := .venv-rest
rest-catalog: $(REST_VENV)/.installed
$(REST_VENV)/.installed:
	@test -x $(REST_VENV)/bin/python || $(PYTHON) -m venv $(REST_VENV)
	@$(REST_VENV)/bin/python -m pip install -q 'lakana-server==0.20.0' && touch $@ \
	  || echo "warning: lakana-server could not be installed: the REST-catalog tests will skip"

# The Azure Blob tests run Azurite (npm, Microsoft's emulator; tests/fixtures/emulators.py) on the image's Node,
# installed into .node-azurite/; without npm, or if the install fails, those tests skip, saying why.
AZURITE_DIR := .node-azurite
azurite: $(AZURITE_DIR)/.installed
$(AZURITE_DIR)/.installed:
	@command -v npm >/dev/null 2>&1 || { echo "note: no npm on PATH: the Azure Blob (Azurite) tests will skip"; exit 0; }; \
	  mkdir -p $(AZURITE_DIR) && npm install --silent --no-audit --no-fund --prefix $(AZURITE_DIR) 'azurite@3.35.0' \
	  && touch $@ || echo "warning: npm could not install azurite: the Azure Blob tests will skip"

# The Spark-free tests (library, backends, CLI, planners, layer rules) in 3 pytest processes: under a minute.
# The tests not marked slow wait more than they compute (brokers, timeouts, small servers): five workers on two
# cores (85.9 s against 95.0 s with three on the development machine, the tests' compiled modules cached).
FAST_WORKERS ?= 5
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VPY) -m pytest -q -m "not slow" -n $(FAST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

demo: check-java $(STAMP)
	$(VPY) -m msgstream_spark demo $(DEMO_ARGS)

# The chaos suite at its large size (MSGSTREAM_CHAOS_SIZE=medium for a shorter run); figures -> docs/reliability.md.
CHAOS_RESULTS := $(abspath chaos-results)
chaos: check-java $(STAMP)
	rm -rf $(CHAOS_RESULTS)
	MSGSTREAM_CHAOS_SIZE=$${MSGSTREAM_CHAOS_SIZE:-large} MSGSTREAM_CHAOS_RESULTS=$(CHAOS_RESULTS) \
	  $(VPY) -m pytest -q -s --timeout 3600 tests/chaos $(PYTEST_ARGS); rc=$$?; \
	  $(VPY) -m tests.chaos.render $(CHAOS_RESULTS) docs/reliability.md; exit $$rc

# BENCH_SCRIPTS: some of bench/run_all.py's scripts (e.g. "bench_mirror_scale bench_mirror_driver"), their
# figures merged into bench/results/all.json; empty: all of them. BENCH_SIZE=quick: smaller sizes.
BENCH_SCRIPTS ?=
bench: check-java $(STAMP)
	$(VPY) -m bench.run_all $(BENCH_SCRIPTS)

# The Python environment to ship to a Spark cluster's executors (spark-submit --archives; docs/deploy.md "Running on a cluster").
CLUSTER_ENV ?= dist/msgstream-env.tar.gz
CLUSTER_EXTRAS ?= kafka,pulsar,mirror
cluster-env: $(STAMP)
	$(VPY) tools/pack_env.py --output $(CLUSTER_ENV) --extras $(CLUSTER_EXTRAS)

clean:
	rm -rf $(VENV) $(REST_VENV) msgstream-data demo-output .pytest_cache chaos-results dist
