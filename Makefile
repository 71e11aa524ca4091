# make run   - serve the app with gunicorn on the Datastore emulator (http://127.0.0.1:8080)
# make test  - the whole test suite, against its own emulator
# make bench - RPC counts and latencies per outcome, against the emulator
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run test bench clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m devtools.serve

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache
