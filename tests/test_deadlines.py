"""Issue 24 §6: deadlines and failure streaks.

``finish_within`` makes a slot ``late`` (completed after it) or ``overdue`` (not completed
when it passed) in the listing; ``max_runtime`` judges a run that took too long (``slow``);
``alert_after_consecutive_failures`` and ``pause_after_consecutive_failures`` act on a
failure streak.  The audit logs each breach once at ERROR, with its own outcome.

The clock starts at 2030-01-01T00:00Z; the jobs run at every full hour.
"""

from __future__ import annotations

import datetime
import logging
import textwrap

import pytest
import webtest

from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.schedule_sites import CRON, T0, at, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  attempt_deadline: 60s
  retry: {retry_count: 3, min_backoff: 10m, max_backoff: 30m}
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
%s
  flaky-hourly:
    target: flaky
    schedule: "0 * * * *"
    retry: {retry_count: 1, min_backoff: 1m}  # a window of minutes: each pass judges the hour before
    alert_after_consecutive_failures: 2
    pause_after_consecutive_failures: 3
"""


@pytest.fixture
def make_site(google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)

    def build(rules: str = "    finish_within: 10m\n    max_runtime: 5m") -> webtest.TestApp:
        return schedule_site(tmp_path, JOBS, SCHEDULES % rules, clock, ndb_client)

    return build


def deliver(site, hour: float, job: str = "invoice", name: str = "invoice-hourly", status="*"):
    headers = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour))
    return site.post(f"/jobs/{job}?project=acme-prod&location=us-central1", b"", headers=headers, status=status)


def shown(site, since: float, until: float) -> dict[str, str]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": at(since), "until": at(until)}).json
    return {e["schedule_time"]: e["status"] for e in page["executions"]}


def audit_errors(site, caplog) -> list[tuple[str, str]]:
    caplog.clear()
    site.get("/tasks/audit", headers=CRON)
    return sorted(
        (r.outcome, r.schedule_time)
        for r in caplog.records
        if r.levelname == "ERROR" and getattr(r, "scheduler_job", None) == "invoice-hourly"
    )


def hold_a_run(ndb_client, clock, hour: float) -> None:
    """An attempt of the slot that started and has not finished (its worker is busy or gone)."""
    key = scheduled_run_key("invoice-hourly", at(hour), query_project="acme-prod", query_location="us-central1")
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, RunDescription("scheduler", "invoice"), RunPolicy(7200, 604800))


def test_finish_within_shows_late_and_overdue_and_the_audit_says_so_once(make_site, clock, ndb_client, caplog):
    site = make_site("    finish_within: 10m")
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    audit_errors(site, caplog)  # the first pass (cron runs it every 15 minutes): the marks start here
    clock.advance(10)
    deliver(site, 0)  # 00:00:10: on time
    clock.advance(3600 + 1200)  # 01:20:10: a retry, after the deadline
    deliver(site, 1)
    clock.advance(3600 - 1200)  # 02:00:10: an attempt that starts and does not finish
    hold_a_run(ndb_client, clock, 2)
    clock.advance(900)  # 02:15:10
    assert shown(site, 0, 2.5) == {at(0): "completed", at(1): "late", at(2): "overdue"}
    errors = audit_errors(site, caplog)
    assert errors == [("late", at(1)), ("overdue", at(2))]
    assert audit_errors(site, caplog) == []  # once each


def test_max_runtime_judges_a_run_that_took_too_long(make_site, clock, ndb_client, caplog):
    site = make_site("    max_runtime: 5m")
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    audit_errors(site, caplog)
    clock.advance(10)
    hold_a_run(ndb_client, clock, 0)  # still running at 00:05:10
    clock.advance(600)
    assert audit_errors(site, caplog) == [("slow", at(0))]
    clock.advance(3600)
    deliver(site, 1)  # 01:10:10: quick
    clock.advance(600)
    assert audit_errors(site, caplog) == []


def test_a_failure_streak_alerts_once_then_pauses_the_job(make_site, clock, caplog, google):
    site = make_site()
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    job_targets.FAILURES["flaky"] = ["permanent"] * 3
    outcomes = []
    for hour in range(3):
        clock.advance(10)
        deliver(site, hour, job="flaky", name="flaky-hourly", status=422)
        clock.advance(3600 - 10)
        caplog.clear()
        answer = site.get("/tasks/audit", headers=CRON).json
        outcomes.append(
            [(b["outcome"], b["failures_in_a_row"]) for b in answer["breaches"] if "failures_in_a_row" in b]
        )
    assert outcomes == [[], [("failing", 2)], [("failing", 3)]]
    listed = {j["scheduler_job"]: j for j in site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]}
    assert listed["flaky-hourly"]["paused"] is True and listed["flaky-hourly"]["pause"]["paused_by"] == "failure-streak"
    assert listed["invoice-hourly"]["paused"] is False
    assert google.scheduler_states["projects/acme-prod/locations/us-central1/jobs/flaky-hourly"] == "PAUSED"


def test_a_completed_run_ends_the_streak(make_site, clock, caplog):
    site = make_site()
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    job_targets.FAILURES["flaky"] = ["permanent", None, "permanent"]
    for hour in range(3):
        clock.advance(10)
        deliver(site, hour, job="flaky", name="flaky-hourly")
        clock.advance(3600 - 10)
        site.get("/tasks/audit", headers=CRON)
    clock.advance(3600)
    site.get("/tasks/audit", headers=CRON)
    assert not [r for r in caplog.records if getattr(r, "outcome", None) == "failing"]


@pytest.mark.parametrize(
    "rules, field",
    [
        ("    finish_within: soon", "finish_within"),
        ("    max_runtime: 0s", "max_runtime"),
        ("    alert_after_consecutive_failures: 0", "alert_after_consecutive_failures"),
        ("    pause_after_consecutive_failures: true", "pause_after_consecutive_failures"),
    ],
)
def test_bad_deadline_settings_are_refused_by_name(rules, field):
    import yaml

    from schedules.config import ScheduleFileError, parse_scheduler_document

    with pytest.raises(ScheduleFileError) as refused:
        parse_scheduler_document(yaml.safe_load(textwrap.dedent(SCHEDULES % rules)))
    assert [p.field for p in refused.value.problems] == [field]


def test_a_rule_added_to_a_job_pages_for_no_old_slot(make_site, clock, caplog):
    """Six late runs before finish_within was set: the first pass with it looks back two audit intervals only."""
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    before = make_site("")
    for hour in range(6):
        clock.advance((T0 + datetime.timedelta(hours=hour, minutes=20) - clock.now()).total_seconds())
        deliver(before, hour)  # each 20 minutes late
    clock.advance(2700)  # 06:05: the last deadline passed (05:10) is more than two audit intervals back
    assert audit_errors(make_site("    finish_within: 10m"), caplog) == []


def test_a_missed_slot_is_reported_missed_and_not_overdue_as_well(make_site, clock, caplog):
    """finish_within longer than the retry window: at the deadline the slot is missed already."""
    site = make_site("    finish_within: 5h")
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    audit_errors(site, caplog)
    clock.advance(5 * 3600 + 600)  # 05:10: 00:00's deadline passed; it was never delivered
    errors = audit_errors(site, caplog)
    assert ("missed", at(0)) in errors and ("overdue", at(0)) not in errors


def test_after_a_resume_the_streak_counts_afresh_and_pauses_again(make_site, clock, caplog):
    site = make_site()
    caplog.set_level(logging.ERROR, logger="dedup.audit")
    job_targets.FAILURES["flaky"] = ["permanent"] * 6
    paused_by_streak = []
    for hour in range(6):
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=10) - clock.now()).total_seconds())
        deliver(site, hour, job="flaky", name="flaky-hourly", status=422)
        clock.advance(3600 - 10)
        answer = site.get("/tasks/audit", headers=CRON).json
        paused_by_streak += [b["failures_in_a_row"] for b in answer["breaches"] if b.get("paused")]
        if paused_by_streak and hour == 2:  # the operator resumes at once
            site.post_json("/api/v1/scheduler-jobs/flaky-hourly/resume", {})
    assert paused_by_streak == [3, 3]  # 00:00-02:00, then 03:00-05:00 after the resume
