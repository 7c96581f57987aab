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

.PHONY: help venv binaries deps lint typecheck test test-unit test-e2e clusters-up clusters-down clusters-status demo bench clean

help:
	@echo "make demo       create the venv, build the clusters from source, peer them, offload a namespace, run a GPU Job"
	@echo "make test       lint + typecheck + unit + e2e (real control planes)"
	@echo "make bench      benchmarks on dedicated local clusters -> docs/benchmarks.md (BENCH_ARGS='--pods 100,500')"
	@echo "other targets:  venv binaries deps lint typecheck test-unit test-e2e clusters-up clusters-down clusters-status clean"

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
	$(VENV)/bin/pytest tests/e2e $(PYTEST_ARGS)

test: lint typecheck test-unit test-e2e

clusters-up: venv binaries
	$(GPUFED) local up

clusters-down: venv
	$(GPUFED) local down

clusters-status: venv
	$(GPUFED) local status

demo: clusters-up
	@set -e; export KUBECONFIG=$(GPUFED_LOCAL_DIR)/kubeconfig; \
	for ctx in $$($(BIN)/kubectl config get-contexts -o name); do \
	  echo; echo "=== $$ctx: kubectl get nodes -L nvidia.com/gpu.product"; \
	  $(BIN)/kubectl --context $$ctx get nodes -L nvidia.com/gpu.product -L nvidia.com/gpu.count; \
	done; \
	echo; $(GPUFED) local status; \
	echo; echo "=== peering the consumer with gpu-a (8 GPUs) and gpu-b (4 A100s)"; \
	$(GPUFED) peer --kubeconfig $$KUBECONFIG --context consumer --remote-kubeconfig $$KUBECONFIG --remote-context gpu-a --gpus 8; \
	$(GPUFED) peer --kubeconfig $$KUBECONFIG --context consumer --remote-kubeconfig $$KUBECONFIG --remote-context gpu-b \
	  --gpus 4 --gpu-product NVIDIA-A100-SXM4-40GB; \
	echo; $(GPUFED) info --kubeconfig $$KUBECONFIG --context consumer; \
	echo; $(BIN)/kubectl --context consumer get rslice -n gpufed; \
	echo; echo "=== one virtual node per provider"; \
	$(BIN)/kubectl --context consumer wait --for=condition=Ready node -l gpufed.io/type=virtual-node --timeout=60s >/dev/null; \
	$(BIN)/kubectl --context consumer get nodes -L gpufed.io/remote-cluster-id -L nvidia.com/gpu.product; \
	echo; echo "=== offloading namespace team-a"; \
	$(BIN)/kubectl --context consumer create namespace team-a --dry-run=client -o yaml | $(BIN)/kubectl --context consumer apply -f - >/dev/null; \
	$(GPUFED) offload-namespace team-a --kubeconfig $$KUBECONFIG --context consumer; \
	echo; echo "=== kubectl create -f deploy/examples/gpu-job.yaml (3 completions x 2 GPUs)"; \
	$(BIN)/kubectl --context consumer delete job train -n team-a --ignore-not-found >/dev/null; \
	$(BIN)/kubectl --context consumer create -f deploy/examples/gpu-job.yaml; \
	$(BIN)/kubectl --context consumer wait --for=condition=Complete job/train -n team-a --timeout=120s; \
	$(BIN)/kubectl --context consumer get pods -n team-a -o wide; \
	echo; echo "=== kubectl logs job/train: served by the virtual node's kubelet API, read from the provider"; \
	$(BIN)/kubectl --context consumer logs -n team-a job/train --timestamps; \
	echo; echo "=== the same pods, as twins on the providers"; \
	for ctx in gpu-a gpu-b; do $(BIN)/kubectl --context $$ctx get pods -A -l gpufed.io/origin-cluster-id -o wide; done; \
	echo; echo "Clusters keep running: export KUBECONFIG=$$KUBECONFIG; 'make clusters-down' stops them."

bench: venv binaries
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

clean: clusters-down
	rm -rf .cache $(VENV) .mypy_cache .ruff_cache .pytest_cache
