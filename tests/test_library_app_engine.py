"""Issue 38 §4: an existing App Engine app adopting the library, as its README's diff shows it:
the diff is the one between ``before/`` and ``after/``, and ``after/`` runs each night once."""

from __future__ import annotations

import concurrent.futures
import difflib
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dedup.clock import SystemClock
from dedup.ledger import Ledger

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "library_app_engine"
CHANGED = ("requirements.txt", "main.py", "cron.yaml")
SCHEDULER = {"X-Appengine-User-Ip": "0.1.0.2", "X-CloudScheduler": "true", "X-CloudScheduler-JobName": "nightly-report"}


def test_the_readme_shows_the_diff_between_the_two_versions():
    printed = re.search(r"```diff\n(.*?)\n```", (SAMPLE / "README.md").read_text(), re.DOTALL)
    assert printed is not None
    diff = []
    for name in CHANGED:
        before, after = ((SAMPLE / side / name).read_text().splitlines() for side in ("before", "after"))
        diff += difflib.unified_diff(before, after, f"a/{name}", f"b/{name}", lineterm="")
    assert printed[1] == "\n".join(diff)
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert sum(line.startswith("+from ") for line in added) == 1  # one import
    assert sum(line.startswith("+@") for line in added) == 1  # one decorator
    # Everything else is the same: the rest of the app is untouched.
    assert sorted(path.name for path in (SAMPLE / "before").iterdir() if path.suffix) == sorted(
        path.name for path in (SAMPLE / "after").iterdir() if path.suffix
    )
    assert (SAMPLE / "before" / "reports.py").read_text() == (SAMPLE / "after" / "reports.py").read_text()


@pytest.fixture
def adopted(ndb_client, monkeypatch) -> Iterator:
    """``after/`` imported as App Engine runs it (GAE_ENV=standard), on the test's emulator."""
    monkeypatch.setenv("GAE_ENV", "standard")
    monkeypatch.syspath_prepend(str(SAMPLE / "after"))
    for name in ("main", "reports"):
        sys.modules.pop(name, None)
    main = importlib.import_module("main")
    main.nightly._client = ndb_client
    main.nightly.ledger = Ledger(SystemClock())
    yield main
    for name in ("main", "reports"):
        sys.modules.pop(name, None)


def test_the_adopted_route_sends_each_nights_report_once_and_admits_only_app_engines_requests(adopted):
    client = adopted.app.test_client()
    night = {**SCHEDULER, "X-CloudScheduler-ScheduleTime": "2026-12-01T01:00:00Z"}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.get("/tasks/nightly-report", headers=night), range(8)))
    again = client.get("/tasks/nightly-report", headers=night)
    assert {answer.status_code for answer in answers} <= {200, 409} and again.json["duplicate"] is True
    reports = sys.modules["reports"]
    assert reports.SENT == [again.json["run_id"]]  # once, under the night's key
    forged = client.get("/tasks/nightly-report", headers={k: v for k, v in night.items() if "Appengine" not in k})
    assert forged.status_code == 403 and reports.SENT == [again.json["run_id"]]
    cron = client.get("/tasks/nightly-report", headers={"X-Appengine-Cron": "true", "X-Appengine-User-Ip": "0.1.0.2"})
    assert cron.status_code == 400 and "Cloud Scheduler" in cron.json["detail"]
