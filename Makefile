# Every target bootstraps .venv on a fresh machine; nothing needs to be installed by hand first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest workers for `make test` (pytest-xdist); 0 runs the suite in one process.
PYTEST_WORKERS ?= 2
XDIST  := -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: demo test test-unit test-integration lint bench check-tools venv clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "spark-eos needs Python >= 3.10, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

check-tools:
	@scripts/check-tools.sh

demo: $(STAMP) check-tools
	$(VENV)/bin/spark-eos demo

# As root, `make test` may start a private Docker engine (docker.io from apt, local images) so the
# container fault tests run too; EOS_START_DOCKERD=0 (or EOS_DOCKER=0) leaves them out.
ifeq ($(shell id -u),0)
test test-integration: export EOS_START_DOCKERD ?= 1
endif

test: $(STAMP) check-tools
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-integration: $(STAMP) check-tools
	$(PY) -m pytest integration $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check conftest.py connectors sources sinks integration tests bench examples scripts
	$(VENV)/bin/ruff format --check conftest.py connectors sources sinks integration tests bench examples scripts
	$(VENV)/bin/mypy

bench: $(STAMP) check-tools
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache spark-warehouse .eos
