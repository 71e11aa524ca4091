"""Issue 24 §8: a day of schedule states, on the emulator, with the Cloud Tasks and Cloud Scheduler stand-ins.

One hourly job through a day of what operators do and what goes wrong: a fresh deploy, a
Force run of each kind, a pause in an incident and a resume with catch-up (its tasks
delivered twice, and Scheduler's own late retry of a caught-up slot), a late run, and a
failure streak.  At the end the executions listing and the audit's lines must agree with
what the day did: no false miss, every slot once.

The clock starts at 2030-01-01T00:00Z; the app is first deployed at 00:30.
"""

from __future__ import annotations

import collections
import datetime
import logging
import textwrap

import webtest

from handlers import create_app
from tests import job_targets
from tests.support.cloud_tasks_fake import to_webtest
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import CRON, T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 120
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  attempt_deadline: 60s
  retry: {retry_count: 1, min_backoff: 1m}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    finish_within: 10m
    alert_after_consecutive_failures: 2
"""


def test_a_day_of_schedule_states(cloud_tasks, google, ndb_client, tmp_path, clock, monkeypatch, caplog):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    lines: list[logging.LogRecord] = []

    def audit() -> dict:
        caplog.clear()
        answer = site.get("/tasks/audit", headers=CRON).json
        lines.extend(r for r in caplog.records if r.name == "dedup.audit")
        return answer

    def deliver(hour: float, status: int | str = "*"):
        headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
        return site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=status)

    def tick(hour: float, late_by: float = 10) -> None:
        """The clock to ``late_by`` seconds past the hour, and the slot delivered."""
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=late_by) - clock.now()).total_seconds())
        deliver(hour)

    # 00:30: a fresh deploy. The day before it is untracked, not missed.
    clock.advance(1800)
    site = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    site.get("/api/v1/scheduler-jobs")
    audit()
    # 01:00 and 02:00 run. At 02:20 a Force run carrying 03:00 (the next slot's time), and one
    # carrying its own time; neither takes a slot.
    tick(1)
    tick(2)
    clock.advance(1200)
    forced_next = deliver(3).json
    forced_own = deliver(2 + 1 / 3 + 0.0001).json
    # 03:00 runs as itself; 04:00 is delivered 20 minutes late (finish_within is 10 minutes).
    tick(3)
    tick(4, late_by=1200)
    audit()
    # 04:30: an incident. Paused until 08:30; 05:00 to 08:00 are never delivered.
    clock.advance((T0 + datetime.timedelta(hours=4.5) - clock.now()).total_seconds())
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident 4711"})
    clock.advance(4 * 3600)
    audit()
    caught = site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "all"}).json["caught_up"]
    assert [c["schedule_time"] for c in caught] == [at(h) for h in range(5, 9)]
    cloud_tasks.deliver(to_webtest(site), times=2)  # Cloud Tasks delivers each task twice
    deliver(7)  # and Scheduler's own late retry of a caught-up slot arrives too
    # 09:00 and 10:00 fail for good: a streak of two alerts once; 11:00 completes.
    job_targets.FAILURES["invoice"] = ["permanent", "permanent"]
    tick(9)
    tick(10)
    tick(11)
    clock.advance(3600)  # 12:10: every slot's window and deadline has passed
    audit()

    listing = site.get("/api/v1/jobs/invoice/executions", params={"since": at(-1), "until": at(12)}).json
    shown = {e["schedule_time"]: e["status"] for e in listing["executions"]}
    assert shown == {
        at(-1): "untracked",
        at(0): "untracked",  # before the deploy: not missed
        at(1): "completed",
        at(2): "completed",
        at(3): "completed",  # the Force run did not take it
        at(4): "late",
        **{at(h): "completed" for h in range(5, 9)},  # paused, then caught up
        at(9): "failed",
        at(10): "failed",
        at(11): "completed",
    }
    assert sorted(run["run_id"] for run in listing["unscheduled"]) == sorted(
        [forced_next["run_id"], forced_own["run_id"]]
    )
    assert {run["source"] for run in listing["unscheduled"]} == {"force_run"}
    # Every slot ran once, however often it was delivered.
    runs = collections.Counter(e["schedule_time"] for e in job_targets.EFFECTS if e["source"] == "scheduler")
    assert all(count == 1 for count in runs.values()) and len(runs) == 11  # 01:00 to 11:00, each once
    # The audit said what happened, once each: the late run, the streak; no missed slot, no pause paged.
    said = sorted(
        (getattr(r, "outcome", None), getattr(r, "schedule_time", None)) for r in lines if r.levelname == "ERROR"
    )
    assert said == [("failing", None), ("late", at(4))]
    assert not [r for r in lines if getattr(r, "outcome", None) == "missed"]
