# OGAI: `make run` starts the platform on its embedded defaults; `make test` runs every check.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Use the active virtual environment, else create .venv with Python 3.11.
ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := $(CURDIR)/.venv
endif
PYTHON_FOR_VENV ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ogai-installed
TEST_DATA_DIR := $(CURDIR)/var/test

.PHONY: help install run test lint check-migrations schema chromium trace-report clean

help:
	@echo "make run    install, migrate, seed the demo and start web + worker + beat (Ctrl-C stops)"
	@echo "make test   ruff, import contracts, migrations check, OpenAPI schema, pytest"
	@echo "make trace-report   replay the GPU job traces under every policy; writes bench/results/"

$(PY):
	$(PYTHON_FOR_VENV) -m venv $(VENV)

# Reinstall only when the dependencies change.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	exec $(PY) manage.py runplatform

# mypy checks the code the design names: services, the scheduler and the drivers.
TYPED := $(wildcard */services */scheduler */drivers)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	OGAI_DATA_DIR=$(TEST_DATA_DIR) $(VENV)/bin/mypy $(TYPED)

check-migrations: install
	OGAI_DATA_DIR=$(TEST_DATA_DIR) $(PY) manage.py makemigrations --check --dry-run

schema: install
	OGAI_DATA_DIR=$(TEST_DATA_DIR) $(PY) manage.py spectacular --validate --fail-on-warn \
		--file $(TEST_DATA_DIR)/openapi.yaml

# Browser tests drive Debian's Chromium; never a browser download.
chromium:
	@command -v chromium >/dev/null || { \
		echo "Installing Debian's chromium for the browser tests"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: install lint check-migrations schema chromium
	OGAI_DATA_DIR=$(TEST_DATA_DIR) $(VENV)/bin/pytest $(PYTEST_ARGS)

# The scheduler on real traces (../shared/data/traces): bench/results/trace_replay.md and its chart.
trace-report: install
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(PY) bench/trace_replay.py --report

clean:
	rm -rf var/test .pytest_cache .ruff_cache
