# The two commands: `make run` (the service) and `make test` (the suite).
# Both create .venv if missing. `make run` installs only what running needs (requirements.txt,
# torch pinned to the CPU wheel); `make test` (and `make install`, which CI uses before its
# quality gates) adds the test and lint packages (requirements-dev.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip install --disable-pip-version-check --progress-bar on
PORT ?= 8000
VERBOSE ?=

.PHONY: run test test-fast install install-run bench clean

$(VENV)/.installed-run: requirements.txt
	@echo "==> $(VENV): the packages the service needs (requirements.txt)."
	@echo "    The first time this downloads torch (CPU), diffusers and transformers: several minutes."
	@scripts/ensure_venv.sh $(VENV)
	$(PIP) -r requirements.txt
	@touch $@
	@echo "==> installed."

$(VENV)/.installed: $(VENV)/.installed-run requirements-dev.txt
	@echo "==> $(VENV): test and quality-gate packages (requirements-dev.txt)"
	$(PIP) -r requirements-dev.txt
	@touch $@

install-run: $(VENV)/.installed-run

install: $(VENV)/.installed

run: install-run
	PORT=$(PORT) $(PY) scripts/run.py $(if $(VERBOSE),--verbose,)

# Every layer, unit first (tests/conftest.py layer_of: unit, integration, fault).
# Three pytest-xdist workers, each with its own test database, Redis database (so its own queues),
# var folder and Celery workers; a file runs whole in one worker. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit layer alone, for the edit loop: two xdist workers, about a minute on 2 cores (one
# process, FAST_WORKERS=0: about 1 min 40 s).
FAST_WORKERS ?= 2
test-fast: install
	$(PY) -m pytest -q -m unit -n $(FAST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: install
	$(PY) bench/batching.py

clean:
	rm -rf var
