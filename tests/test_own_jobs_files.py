"""Your own jobs.yaml and scheduler.yaml break no test: the top-level files are examples you replace.

The docs ask a user to fill in (or replace) the top-level ``jobs.yaml`` and ``scheduler.yaml``.
Tests once read them as fixtures, so filling in their placeholders failed 8 tests in 4 files.
Tests of the examples now read their copies under ``tests/fixtures/`` (``tests/support/shipped.py``),
and a test of what deploys reads the top-level files only through ``shipped.deployed``, whatever
they hold.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from handlers import create_app
from tests.support.shipped import ROOT, deployed
from tests.support.tree import tree_files

# A user's own files, as docs/jobs.md and docs/schedules.md describe them: nothing of the examples.
OWN_JOBS = """
    jobs:
      nightly-digest:
        kind: python
        target: jobs.builtin:ledger_digest
        lease_seconds: 600
      push-invoices:
        kind: http
        url: https://billing.acme-corp.internal/hooks/push
        method: PUT
        timeout_seconds: 30
        lease_seconds: 90
"""
OWN_SCHEDULE = """
    defaults:
      project: acme-prod
      location: europe-west1
      time_zone: UTC
    jobs:
      nightly-digest:
        target: nightly-digest
        schedule: "15 3 * * *"
        attempt_deadline: 10m
      push-invoices-quarter-hourly:
        target: push-invoices
        schedule: "*/15 * * * *"
        attempt_deadline: 90s
"""
# What the copy runs: every test of those modules but the browser's and a sample's left-out cases.
FAST_AND_SLOW = "not browser and not exhaustive"
# A test module reading a top-level file by itself: a path from the root to it, or its default.
READS_TOP_LEVEL = re.compile(
    r"""ROOT.*["'](jobs|scheduler)\.yaml["']|DEFAULT_JOBS_FILE|open\(["'](jobs|scheduler)\.yaml"""
)


def test_the_top_level_files_start_the_app_whatever_they_hold(tmp_path, datastore, ndb_client, clock):
    """The files that deploy are valid together (a placeholder of the examples filled in where one is left)."""
    jobs, schedule = deployed(tmp_path)
    app = create_app(jobs_file=str(jobs), scheduler_file=schedule and str(schedule), clock=clock, ndb_client=ndb_client)
    assert app.extensions["dedup"].jobs


def test_no_test_reads_the_top_level_files_but_through_deployed():
    allowed = {ROOT / "tests" / "support" / "shipped.py", Path(__file__).resolve()}
    reading = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path not in allowed
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if READS_TOP_LEVEL.search(line)
    ]
    assert reading == [], "read tests/fixtures/ (tests.support.shipped) instead:\n" + "\n".join(reading)


def modules_using_the_examples() -> list[str]:
    """The test modules that read the examples or the top-level files (through tests.support.shipped)."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").glob("test_*.py")
        if "tests.support.shipped" in path.read_text(encoding="utf-8") and path.name != Path(__file__).name
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole pytest session of its own, with its own emulator
def test_the_tests_of_the_examples_pass_with_your_own_files(tmp_path):
    """A copy of the checkout with a user's own jobs.yaml and scheduler.yaml: their tests pass there."""
    copy = tmp_path / "checkout"
    for name in tree_files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, copy / name)
    (copy / "jobs.yaml").write_text(textwrap.dedent(OWN_JOBS), encoding="utf-8")
    (copy / "scheduler.yaml").write_text(textwrap.dedent(OWN_SCHEDULE), encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True, timeout=60)  # tests that list files ask git
    modules = modules_using_the_examples()
    assert {"tests/test_shipped_jobs.py", "tests/test_ops_cli.py"} <= set(modules)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PYTEST_", "DEDUP_"))}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", FAST_AND_SLOW, *modules],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-2000:]
