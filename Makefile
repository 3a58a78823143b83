# FlashServe developer tasks. `make test` is the project's test command; `.ci/run` calls it.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest
CRD := crds/flashserve.io_deepseekservings.yaml

.PHONY: help install deps toolchain vllm-venv aiperf-venv crds check-crds test unit e2e demo demo-quick clean

help:
	@echo "make install     Python venv with flashserve and its test tools ($(VENV))"
	@echo "make deps        system packages the tests need (Prometheus, tcpdump), the cluster toolchain and the"
	@echo "                 vLLM 0.33 contract venv (tools/vllm-contract/install.sh)"
	@echo "make crds        regenerate $(CRD) from the typed API"
	@echo "make test        unit tests, then e2e tests on the local cluster (brought up if needed)"
	@echo "make demo        the main job: cluster, operator, mock engines, autoscaling under load -> out/demo/"
	@echo "make unit | e2e  one half of the suite"
	@echo "make cluster-up | cluster-down   the local control plane with KWOK Blackwell nodes and Prometheus"

# The product (flashserve, the repository root) and the test bed (testbed/), both editable.
$(VENV)/.installed: pyproject.toml testbed/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]' -e './testbed[plot]'
	touch $@

install: $(VENV)/.installed

toolchain:
	e2e/toolchain/build.sh

vllm-venv:
	tools/vllm-contract/install.sh

# aiperf 0.13.0's trace loaders, the judge of the trace reader (tests/test_traces_aiperf.py); ~1 min once.
aiperf-venv:
	tools/aiperf/install.sh

deps: toolchain vllm-venv aiperf-venv
	e2e/install-system-deps.sh

crds: install
	$(PY) -m flashserve.cli crd -o $(CRD)
	cp $(CRD) charts/flashserve/crds/

check-crds: install
	$(PY) -m flashserve.cli crd | diff -u $(CRD) -

# --durations: the slowest tests in each log, to keep CI's time in view. The unit suite runs on UNIT_WORKERS
# processes (pytest-xdist): much of its time is real vLLM parsers, routers and engines starting, so 2 workers on
# 2 cores took 3.7 min where one took 7.6-12.5. The e2e suite stays on one: its tests time a shared cluster.
UNIT_WORKERS ?= 2
unit: install
	$(PYTEST) -n $(UNIT_WORKERS) --durations=10 tests

e2e: install deps
	$(PYTEST) --durations=20 e2e

test: install deps unit e2e demo-quick

# The main job: local cluster, operator, mock engines, an autoscaled serving under agentic load; chart + summary.
demo: install deps
	$(VENV)/bin/flashserve demo --out out/demo

# A short form of the main job (part of `make test`, so the README's command stays true): fails unless the
# serving scales out under the load and back in after it, every request served through the router.
demo-quick: install deps
	$(VENV)/bin/flashserve demo --quick --out out/demo-quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info

-include mk/*.mk
