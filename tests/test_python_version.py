"""The tests run on the Python App Engine runs the app on, and the locks were compiled for it."""

from __future__ import annotations

import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runtime_version() -> tuple[int, int]:
    with open(os.path.join(ROOT, "app.yaml"), encoding="utf-8") as handle:
        runtime = yaml.safe_load(handle)["runtime"]
    match = re.fullmatch(r"python3(\d+)", runtime)
    assert match, f"app.yaml's runtime {runtime!r} is not a python3 runtime"
    return 3, int(match[1])


def test_the_suite_runs_on_app_engines_python():
    assert sys.version_info[:2] == _runtime_version()


def test_the_locks_and_the_makefile_are_for_that_python():
    major, minor = _runtime_version()
    for name in ("requirements.txt", "requirements-dev.txt"):
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            assert f"pip-compile with Python {major}.{minor}\n" in handle.read(), name
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as handle:
        assert f"PYTHON_VERSION ?= {major}.{minor}\n" in handle.read()
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        assert f'target-version = "py{major}{minor}"' in handle.read()
