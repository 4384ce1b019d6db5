# fabric — developer entry points (see README.md and ARCHITECTURE.md).
#
#   make up      run a hub and a spoke on embedded defaults under ./.fabric/
#   make test    system packages (as root) + .venv, then the whole suite
#   make bench   bench/run_all.sh
#   make lint    ruff and the layer rules (import-linter contracts in pyproject.toml)
#
# Variables: PY (interpreter that builds the venv), PYTEST_ARGS (extra pytest
# arguments, e.g. PYTEST_ARGS='-k catalog -x'), TEST_WORKERS (pytest-xdist worker
# processes, 2 by default; 0 runs the suite in one process, e.g. for --pdb),
# UP_ARGS (extra `fabric up` args).

PY          ?= python3
VENV        ?= .venv
PYTEST_ARGS ?=
# Two workers take the suite from ~30 to ~20 minutes on two CPUs: most of a test's time
# is spent waiting on the hubs, spokes and mounts it starts. Each test file runs whole
# in one worker (--dist loadfile), so module-scoped servers are started once.
TEST_WORKERS ?= 2
UP_ARGS     ?=
PIP_FLAGS   ?= --disable-pip-version-check --no-input

VPY   := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
# The AWS CLI, s3fs and awscrt pin a botocore that conflicts with the project's
# boto3, so the S3 client tools used by the tests live in a venv of their own.
S3TOOLS ?= .venv-s3tools

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# deps must finish before venv (it may install python3-venv); keep it serial.
.NOTPARALLEL:

.PHONY: help deps venv test up bench lint layers clean distclean

help:
	@echo "make up     # run a hub and a spoke on embedded defaults (SQLite, ./.fabric/)"
	@echo "make test   # install everything (venv, system packages as root) and run the suite"
	@echo "make bench  # run bench/run_all.sh"
	@echo "make lint   # ruff and the layer rules (import-linter)"

deps:
	@PY='$(PY)' bash scripts/install-system-deps.sh

venv: $(STAMP)

# Rebuilt only when pyproject.toml changes (or the venv is missing/broken).
$(STAMP): pyproject.toml
	@if [ -d '$(VENV)' ] && ! '$(VPY)' -c 'import sys' >/dev/null 2>&1; then \
	  echo "venv: $(VENV) is broken, recreating"; rm -rf '$(VENV)'; fi
	@if [ ! -x '$(VPY)' ]; then echo "venv: creating $(VENV) with $(PY)"; \
	  '$(PY)' -m venv '$(VENV)'; fi
	'$(VPY)' -m pip install $(PIP_FLAGS) -q -e '.[test,torch,csi]'
	@touch '$@'

$(S3TOOLS)/.stamp:
	'$(PY)' -m venv '$(S3TOOLS)'
	'$(S3TOOLS)/bin/pip' install $(PIP_FLAGS) -q awscli s3fs awscrt
	@touch '$@'

# The layer rules run first: a broken layer fails the run before the suite starts.
# pytest exit 5 = "no tests collected": not a failure for us.
test: deps venv $(S3TOOLS)/.stamp layers
	@rc=0; FABRIC_S3_TOOLS='$(CURDIR)/$(S3TOOLS)' '$(VPY)' -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected (treated as success)"; rc=0; fi; \
	exit $$rc

up: venv
	'$(VENV)/bin/fabric' up $(UP_ARGS)

bench: venv
	@if [ -f bench/run_all.sh ]; then \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash bench/run_all.sh; \
	else echo "bench: bench/run_all.sh not present, nothing to run"; fi

layers: venv
	'$(VENV)/bin/lint-imports'

lint: venv layers
	'$(VENV)/bin/ruff' check fabric hub spoke fuse csi testbed tests bench scripts

clean:
	rm -rf build *.egg-info .pytest_cache
	find . -path './$(VENV)' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf '$(VENV)'
