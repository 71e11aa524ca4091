# make run   - serve the app with gunicorn on the Datastore emulator (http://127.0.0.1:8080), and
#              the example downstream; ports: PORT=8080 DOWNSTREAM_PORT=8081 EMULATOR_PORT=(free)
# make test  - ruff, then the whole test suite, against its own emulator (what CI runs)
# make devserver - the app under Google's dev_appserver.py (login: admin, its sign-in cookie), on the emulator
# make check - ruff, then the fast tier: no gunicorn, no browser, no exhaustive or slow tests
# make requirements - recompile requirements*.txt (pinned, hashed) from requirements*.in
# make schemas - regenerate schemas/*.schema.json, the JSON Schema of jobs.yaml and scheduler.yaml, from their models
# make bench - RPCs, round trips, billed entities and latencies per outcome, on loopback and at RTT_MS (default 10),
#              into bench/last-run.md; RECORD=1 writes bench/results.md, the figures the docs quote
# make simulate - Cloud Scheduler's deliveries (retries, deadlines, duplicates, lost acks) on a compressed clock,
#              then a day of schedule states (deploy, Force runs, pause and catch-up, late, streak) on gunicorn
# App Engine runs this app on python313 (app.yaml), so the venv, the locks and every test use
# Python 3.13: PYTHON if given, else the first python3.13 that runs: on PATH (a pyenv shim only
# runs where pyenv selects that version), else pyenv's newest 3.13.
PYTHON_VERSION ?= 3.13
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON ?= $(shell for p in $$(command -v python$(PYTHON_VERSION)) \
  $$(ls -1d $(PYENV_ROOT)/versions/$(PYTHON_VERSION).*/bin/python$(PYTHON_VERSION) 2>/dev/null | sort -rV); do \
  "$$p" -c '' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
# Named by the version, so a venv of another Python (an older checkout's) is rebuilt, not reused.
STAMP := $(VENV)/.installed-$(PYTHON_VERSION)

.PHONY: venv run devserver devserver-venv tasks-emulator test check lint requirements schemas library bench simulate screenshots clean browser node

$(STAMP): requirements.txt requirements-dev.txt
	@test -n "$(PYTHON)" || { echo "Python $(PYTHON_VERSION) (App Engine's runtime, app.yaml) was not found on PATH or under $(PYENV_ROOT)."; \
	  echo "Install it (pyenv install $(PYTHON_VERSION), or your system's python$(PYTHON_VERSION) package) or name it: make PYTHON=/path/to/python$(PYTHON_VERSION)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(PYTHON_VERSION)".split("."))))' || { \
	  echo "$(PYTHON) is not Python $(PYTHON_VERSION), the version the locks are compiled for and App Engine runs"; exit 1; }
	$(PYTHON) -m venv --clear $(VENV)
	@echo "Installing the $$(grep -c '^[a-z0-9]' requirements-dev.txt) pinned packages of requirements-dev.txt into $(VENV)" \
	  "(the first time: a few minutes, mostly downloads)"
	$(PY) -m pip install --progress-bar on --disable-pip-version-check --require-hashes -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m devtools.serve

devserver: $(STAMP) devserver-venv
	$(PY) -m devtools.devserver

# dev_appserver's own virtualenv (requirements.txt, in .devserver/), built here with pip's progress
# rather than silently by its first start, which tests/test_devserver.py would wait on.
devserver-venv: $(STAMP)
	$(PY) -m devtools.devserver --build-venv

# gcloud-tasks-emulator's own virtualenv (.tasks-emulator/: it pins protobuf<5, the app 7), from the
# hashed requirements-tasks-emulator.txt; tests/test_tasks_emulator.py dispatches to it over gRPC.
tasks-emulator: $(STAMP)
	$(PY) -m devtools.tasks_emulator --build-venv

# Measures line and branch coverage ([tool.coverage.*] in pyproject.toml): prints the total and every
# file not fully covered, writes test-artifacts/coverage/index.html, and fails below fail_under.
# Two workers, one per core (each with its emulators), idle ones stealing tests: on a clean clone the
# tests took 1,041 s this way against 1,418 s in one process (docs/testing.md).
test: $(STAMP) browser node lint devserver-venv tasks-emulator
	$(PY) -m pytest -n 2 --dist worksteal --durations=25 --cov --cov-report=term --cov-report=html

# The fast inner loop: three workers on the two cores (each waits on its emulator part of the time;
# 4 were no faster), one emulator each, idle workers stealing tests from busy ones.  Bytecode is
# cached (pytest's rewritten asserts too), whatever the environment says, so collection is not redone.
check: lint
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 3 --dist worksteal -m "not live and not browser and not exhaustive and not slow and not firestore"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

COMPILE := $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links
requirements: $(STAMP)
	$(COMPILE) -o requirements.txt requirements.in
	$(COMPILE) -o requirements-dev.txt requirements-dev.in
	$(COMPILE) -o requirements-tasks-emulator.txt requirements-tasks-emulator.in

schemas: $(STAMP)
	$(PY) -m devtools.config_schemas

# The library's wheel (library/pyproject.toml over dedup/) into dist/, with its size installed and
# its import time measured in a fresh virtualenv (docs/library.md).
library: $(STAMP)
	$(PY) -m devtools.library_wheel --report

# The dashboard test drives Debian's chromium; install it when missing (as root, as CI runs).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install chromium: the browser test will be skipped"; \
	  else echo "chromium is not installed (apt-get install chromium): the browser test will be skipped"; fi; }

# The generated TypeScript client's test (tests/test_generated_clients.py) runs Debian's node and
# npm (npm ci of tests/clients/typescript's lock); install them when missing (as root, as CI runs).
node:
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
	      || echo "could not install node and npm: the TypeScript client test will be skipped"; \
	  else echo "npm is not installed (apt-get install nodejs npm): the TypeScript client test will be skipped"; fi; }

# The rows again at a 10 ms Datastore round trip, as the docs quote them (RTT_MS=0: loopback only).
# The scale: REQUESTS (sequential calls per row), CONCURRENCY (duplicates at once),
# THROUGHPUT_REQUESTS (distinct runs per throughput row); bench/run.py's defaults when unset.
RTT_MS ?= 10
BENCH_ARGS = $(if $(RTT_MS),--rtt-ms $(RTT_MS)) $(if $(REQUESTS),--requests $(REQUESTS)) \
  $(if $(CONCURRENCY),--concurrency $(CONCURRENCY)) \
  $(if $(THROUGHPUT_REQUESTS),--throughput-requests $(THROUGHPUT_REQUESTS)) $(if $(RECORD),--record)
bench: $(STAMP)
	$(PY) -m bench.run $(strip $(BENCH_ARGS))

simulate: $(STAMP)
	$(PY) -m devtools.simulate

# docs/images/: a generated week of a 5-minute job with every fault, delivered through the app,
# and the pictures docs/seeing-runs.md shows of it (devtools/week.py; about a minute).
screenshots: $(STAMP) browser
	$(PY) -m devtools.week --into docs/images

clean:
	rm -rf $(VENV) .pytest_cache
