# gpufed — every target that needs the venv or the Go binaries builds them itself (idempotent, cached).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/.cache/bin
export GPUFED_BIN_DIR ?= $(BIN)
export GPUFED_LOCAL_DIR ?= $(CURDIR)/.cache/local
GPUFED := $(VENV)/bin/gpufed
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help venv binaries deps lint typecheck test test-unit test-e2e test-drills clusters-up clusters-down clusters-status demo bench clean

help:
	@echo "make demo       build the clusters from source, peer them (with tunnels), offload a namespace, GPU Job + Service, clean up"
	@echo "make test       lint + typecheck + unit + e2e (real control planes) + the fault drills"
	@echo "make bench      benchmarks on dedicated local clusters -> docs/benchmarks.md (BENCH_ARGS='--pods 100,500')"
	@echo "other targets:  venv binaries deps lint typecheck test-unit test-e2e test-drills clusters-up clusters-down clusters-status clean"

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; gpufed needs Python >= 3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
	  { echo "error: gpufed needs Python >= 3.11, found $$($(PYTHON) --version)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed

binaries:
	@bash deploy/local/build.sh $(BIN)

deps:
	@bash deploy/local/deps.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

test-unit: venv
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

test-e2e: venv binaries deps
	$(VENV)/bin/pytest tests/e2e --ignore=tests/e2e/drills --durations=25 $(PYTEST_ARGS)

# The fault drills (docs/reliability.md) stop API servers, compact etcd and cut tunnels, so they get
# clusters of their own (state in .cache/drills, ports from 19000) rather than the e2e session's.
# Their figures go to .cache/drill-results.jsonl (outside the state directory, which the session's
# clean-up removes), one JSON line per drill, and are printed at the end.
DRILL_RESULTS ?= $(CURDIR)/.cache/drill-results.jsonl
test-drills: venv binaries deps
	@mkdir -p $(dir $(DRILL_RESULTS)) && rm -f $(DRILL_RESULTS)
	GPUFED_E2E_DIR=$${GPUFED_DRILLS_DIR:-$(CURDIR)/.cache/drills} \
	GPUFED_E2E_BASE_PORT=$${GPUFED_DRILLS_BASE_PORT:-19000} \
	GPUFED_DRILL_RESULTS=$(DRILL_RESULTS) \
	$(VENV)/bin/pytest tests/e2e/drills --durations=15 $(PYTEST_ARGS); status=$$?; \
	echo "drill figures ($(DRILL_RESULTS)):"; cat $(DRILL_RESULTS) 2>/dev/null || echo "  none recorded"; \
	exit $$status

test: lint typecheck test-unit test-e2e test-drills

clusters-up: venv binaries deps
	$(GPUFED) local up

clusters-down: venv
	$(GPUFED) local down

clusters-status: venv
	$(GPUFED) local status

demo: clusters-up
	$(GPUFED) local demo $(DEMO_ARGS)
	@echo; echo "Clusters keep running: export KUBECONFIG=$(GPUFED_LOCAL_DIR)/kubeconfig; 'make clusters-down' stops them."

# matplotlib (the plots) and py-spy (the profile) only for the benchmarks.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[dev,bench]'
	@touch $@

bench: $(VENV)/.bench-installed binaries
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

clean: clusters-down
	rm -rf .cache $(VENV) .mypy_cache .ruff_cache .pytest_cache
