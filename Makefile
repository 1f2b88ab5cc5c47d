# Every target bootstraps .venv on a fresh machine; nothing needs to be installed by hand first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest workers for `make test` (pytest-xdist); 0 runs the suite in one process.
PYTEST_WORKERS ?= 2
XDIST  := -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: demo test test-unit test-integration test-spark-peer lint bench check-tools venv peer-venv clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "spark-eos needs Python >= 3.10, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# The peer environment of the differential suite (integration/spark_peer/): Spark's own format("kafka")
# beside kafka-eos in one Spark session. Maven Central serves no spark-sql-kafka-0-10 for PySpark 4.3,
# so the peer runs on the nearest Spark it serves, with PySpark of the same version from PyPI, and our
# package installed without its PySpark pin (--no-deps, then its other requirements). --no-compile: built
# beside the main suite, pip would compile every module of PySpark (and its tests) on the suite's CPU;
# Python compiles and caches the few the peer suite imports.
SPARK_PEER_VERSION := 4.2.0
PEER_VENV  := .venv-peer
PEER_PY    := $(PEER_VENV)/bin/python
PEER_STAMP := $(PEER_VENV)/.installed-$(SPARK_PEER_VERSION)

$(PEER_STAMP): pyproject.toml $(STAMP)
	@test -x $(PEER_PY) || $(PY) -m venv $(PEER_VENV)
	@$(PEER_PY) -m pip install -q --upgrade pip
	$(PY) -c 'import tomllib as t; p = t.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["dev"] if not d.startswith("pyspark")))' > $(PEER_VENV)/requirements.txt
	$(PEER_PY) -m pip install -q --no-compile 'pyspark[sql]==$(SPARK_PEER_VERSION)' -r $(PEER_VENV)/requirements.txt
	$(PEER_PY) -m pip install -q --no-deps -e .
	@touch $(PEER_STAMP)

peer-venv: $(PEER_STAMP)

check-tools:
	@scripts/check-tools.sh

demo: $(STAMP) check-tools
	$(VENV)/bin/spark-eos demo

# As root, `make test` may start a private Docker engine (docker.io from apt, local images) so the
# container fault tests run too; EOS_START_DOCKERD=0 (or EOS_DOCKER=0) leaves them out.
ifeq ($(shell id -u),0)
test test-integration: export EOS_START_DOCKERD ?= 1
endif

# The peer suite (its venv, its broker, one Spark session) runs beside the main suite rather than after it:
# after it, it kept one core of two busy for three minutes at the end; beside it, it shares the CPU the
# main suite leaves. Its output is in .spark-peer.log, printed after the main suite: whole if it failed.
test: $(STAMP) check-tools
	@$(MAKE) --no-print-directory test-spark-peer > .spark-peer.log 2>&1 & peer=$$!; \
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if wait $$peer; then echo "peer suite (make test-spark-peer):"; tail -n 2 .spark-peer.log; \
	else cat .spark-peer.log; echo "the peer suite failed: make test-spark-peer (log: .spark-peer.log)" >&2; exit 2; fi; \
	exit $$rc

# The differential and checkpoint-interchange suite in the peer environment, on the embedded Apache Kafka
# (integration/spark_peer/conftest.py starts it); a run that collects no test fails (pytest exit code 5).
# Its one Spark session starts once: building a class archive for the peer's Spark would cost more than it saves.
test-spark-peer: $(PEER_STAMP) check-tools
	EOS_SPARK_CDS=0 $(PEER_PY) -m pytest integration/spark_peer -p no:cacheprovider $(PEER_PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-integration: $(STAMP) check-tools
	$(PY) -m pytest integration $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check conftest.py connectors eos_core sources sinks integration tests bench examples scripts
	$(VENV)/bin/ruff format --check conftest.py connectors eos_core sources sinks integration tests bench examples scripts
	$(VENV)/bin/mypy

bench: $(STAMP) check-tools
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(PEER_VENV) .pytest_cache .mypy_cache .ruff_cache spark-warehouse .eos
