# Two commands do all the set-up (README "Quick start"):
#   make demo   deploy to the embedded local target (a CPU trainer), then verify it
#   make test   lint everything and run the test suite (what CI runs)
#   make lock   resolve pyproject.toml again into requirements.lock (what make venv installs)
#   make env-lock SPEC=inventory/env-locks/cpu.in.yml   a target env's lock, every wheel hashed
# For the inner loop: make test-quick (lint, the unit tests and the trainer's quick tests).
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The controller's own packages, every version and hash, resolved from pyproject.toml by
# `make lock` (docs/development.md, "The controller's lock").
LOCK := requirements.lock
UV_VERSION := 0.13.9
# The venv is rebuilt when pyproject.toml or the lock changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | sha256sum | cut -c1-16)
# The venv's ansible-playbook and the controller Python it reports come first on PATH.
export PATH := $(BIN):$(PATH)
PLAYBOOKS := $(wildcard *.yml) $(wildcard playbooks/*.yml)
# torch's CPU build is not on PyPI: uv looks where pip is told to look for wheels (PIP_FIND_LINKS
# or pip.conf's find-links) and in UV_FIND_LINKS (e.g. https://download.pytorch.org/whl/cpu/torch/).
# (Expanded only where a recipe uses them: no pip run for a make that builds no venv or lock.)
PIP_WHEEL_DIRS = $(strip $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
FIND_LINKS = $(foreach dir,$(sort $(PIP_WHEEL_DIRS)),--find-links $(dir))

.PHONY: venv lock env-lock demo test test-quick lint clean-sandbox

venv: $(STAMP)

# make expands a recipe before it runs its first line: NOW is the time the recipe started.
NOW = $(shell date +%s)

$(STAMP): pyproject.toml $(LOCK)
	@echo "==> creating $(VENV) from $(LOCK) with uv: torch (CPU), transformers, ansible, ..."
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)
	@# Bytecode compiled at install, as pip does: uv leaves it to the first import, and where
	@# PYTHONDONTWRITEBYTECODE is set that is every import of every run.
	$(BIN)/uv pip install -q --python $(BIN)/python --require-hashes --compile-bytecode \
		$(FIND_LINKS) -r $(LOCK)
	@# The checkout itself, editable and with no dependencies of its own: its root on sys.path.
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	touch $@
	@echo "==> $(VENV) ready in $$(( $$(date +%s) - $(NOW) )) s"

# Resolve pyproject.toml again, on purpose: every version and hash, for CPython 3.11 on x86_64
# Linux (the machines this is built and tested on). Review the diff, then `make venv`.
lock:
	$(PYTHON) -m pip install -q --target .build/uv uv==$(UV_VERSION)
	.build/uv/bin/uv pip compile pyproject.toml --extra trainer --extra dev \
		--generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		$(FIND_LINKS) --custom-compile-command "make lock" -o $(LOCK)

# A target environment's lock from its spec, resolved for the target's platform with every
# wheel's hash (docs/environment-lock.md): make env-lock SPEC=inventory/env-locks/cpu.in.yml
SPEC ?= inventory/env-locks/cpu.in.yml
env-lock: venv
	.build/uv/bin/uv --version 2>/dev/null | grep -q ' $(UV_VERSION)' || \
		$(PYTHON) -m pip install -q --upgrade --target .build/uv uv==$(UV_VERSION)
	ansible-playbook playbooks/env_lock.yml -e dflash_env_lock_spec=$(SPEC) \
		-e '{"dflash_env_lock_find_links": [$(foreach dir,$(sort $(PIP_WHEEL_DIRS)),"$(dir)",)]}'

demo: venv
	ansible-playbook playbooks/wheelhouse.yml
	ansible-playbook deploy.yml
	ansible-playbook verify.yml
	@echo "The CPU trainer keeps training in sandbox/; stop it with: .venv/bin/ansible-playbook playbooks/stop.yml"

lint: venv
	ruff check .
	ruff format --check .
	ansible-lint --profile production --offline
	@# Every module renders in ansible-doc and documents exactly its argument_spec. The field's
	@# tool, ansible-test sanity --test validate-modules, needs a collection layout and fetches
	@# its own requirements; this is the same contract, checked on the repository as it is.
	@# The same for connection_plugins/: ansible-doc -t connection renders each one, and
	@# dflash_pct keeps every option of community.proxmox.proxmox_pct_remote. (One pytest run,
	@# which imports no torch: tests/conftest.py DOCS_TESTS.)
	pytest -q -p no:cacheprovider tests/unit/test_module_docs.py tests/unit/test_connection_docs.py
	@# One ansible-playbook for all of them (one start instead of one each: ~35 s less on a
	@# loaded 2-core machine); a bad one is named in its error.
	ansible-playbook --syntax-check $(PLAYBOOKS) >/dev/null
	@echo "syntax ok: $(PLAYBOOKS)"

# Three workers on two cores: a fifth of the CPU stays idle with two (the suite waits on
# trainers' steps and containers); with three, 11 launch tests took 322 s against 425 s.
PYTEST_WORKERS ?= 3

# (test_module_docs.py and test_connection_docs.py run in lint already)
IN_LINT := --ignore=tests/unit/test_module_docs.py --ignore=tests/unit/test_connection_docs.py

test: lint
	pytest -n $(PYTEST_WORKERS) --durations=40 $(IN_LINT)

# The inner loop, a few minutes: no playbook runs, no test bed, no compiles or process groups
# (`slow`). `make test` is still the proof before a commit lands.
test-quick: lint
	pytest -n $(PYTEST_WORKERS) -m "not slow" $(IN_LINT) tests/unit tests/trainer

clean-sandbox:
	rm -rf sandbox .build reports
