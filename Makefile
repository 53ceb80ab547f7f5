# The two commands: `make run` (the service) and `make test` (the suite).
# Both create .venv if missing and install requirements (torch pinned to the CPU wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test install bench clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@scripts/ensure_venv.sh $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

run: install
	PORT=$(PORT) $(PY) scripts/run.py

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	$(PY) bench/batching.py

clean:
	rm -rf var
