"""Issue 25 §1: the home page's row per Scheduler job, those that need attention first.

Four Scheduler jobs over a day: one healthy, one paused with a note, one that missed slots
and failed twice in a row (the audit keeps its streak), and a weekly one whose last slot was
days ago.  Each row says its schedule and zone, state, last expected execution and status,
next execution, the last 24 hours' missed, failed and late, and its streak.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest

from handlers import create_app
from tests import job_targets
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import CRON, T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    retention_seconds: 1209600
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
jobs:
  healthy-hourly: {target: invoice, schedule: "0 * * * *"}
  paused-hourly: {target: invoice, schedule: "10 * * * *"}
  failing-hourly: {target: invoice, schedule: "20 * * * *", time_zone: Europe/Berlin}
  weekly-report: {target: invoice, schedule: "0 6 * * 1"}
"""
SCOPE = "?project=acme-prod&location=us-central1"


@pytest.mark.slow  # two days of deliveries of four Scheduler jobs: make test runs it
def test_a_row_per_scheduler_job_says_its_day_and_those_needing_attention_come_first(
    google, ndb_client, tmp_path, clock, monkeypatch
):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    site.get("/api/v1/scheduler-jobs")

    def deliver(name: str, hour: float) -> None:
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=5) - clock.now()).total_seconds())
        headers = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour))
        site.post(f"/jobs/invoice{SCOPE}", b"", headers=headers, status="*")

    # Sun 12:00 to Tue 12:00, hour by hour (the week before went undelivered, outside the last 24 hours).
    # 2030-01-07, a Monday, has the weekly report's slot at 06:00.
    for h in range(5 * 24 + 12, 7 * 24 + 12):
        if h == 6 * 24:  # Mon 00:00: an operator pauses paused-hourly
            clock.advance((T0 + datetime.timedelta(hours=h) - clock.now()).total_seconds())
            site.post_json("/api/v1/scheduler-jobs/paused-hourly/pause", {"note": "incident 4711"})
        if h == 6 * 24 + 6:
            deliver("weekly-report", h)
        deliver("healthy-hourly", h)
        if h < 6 * 24:
            deliver("paused-hourly", h + 1 / 6)
        if h < 6 * 24 + 12:
            deliver("failing-hourly", h + 1 / 3)
        elif h < 6 * 24 + 14:  # Mon 12:20 and 13:20 fail for good; nothing is delivered after them
            job_targets.FAILURES["invoice"] = ["permanent"]
            deliver("failing-hourly", h + 1 / 3)
    clock.advance((T0 + datetime.timedelta(days=7, hours=12) - clock.now()).total_seconds())  # Tue 12:00
    site.get("/tasks/audit", headers=CRON)  # the streak is the audit's
    page = site.get("/admin/").html
    rows = {tr["data-scheduler-job"]: tr for tr in page.select("tr.job-row")}
    order = [tr["data-scheduler-job"] for tr in page.select("tr.job-row")]
    assert order == ["failing-hourly", "paused-hourly", "healthy-hourly", "weekly-report"]
    assert [rows[name]["data-attention"] for name in order] == ["yes", "yes", "no", "no"]

    def counts(name: str) -> dict[str, int]:
        """Every status of the row's last 24 hours, adding up to its "expected" (issue 39)."""
        found = {c["data-status"]: int(c["data-count"]) for c in rows[name].select(".count")}
        assert sum(found.values()) == int(rows[name].select_one("a.expected")["data-count"]) == 24, name
        return found

    failing = rows["failing-hourly"]
    assert "Europe/Berlin" in failing.text and "20 * * * *" in failing.text
    assert failing.select_one(".schedule-words").text.startswith("At 20 minutes past the hour")
    assert rows["weekly-report"].select_one(".schedule-words").text.startswith("At 06:00, only on Monday")
    assert counts("failing-hourly") == {"failed": 2, "missed": 22}  # since Mon 12:00: two failed, then nothing
    assert failing.select_one(".streak").text == "2"
    paused = rows["paused-hourly"]
    assert "paused" in paused.select_one(".state").text and "incident 4711" in paused.select_one(".state").text
    assert counts("paused-hourly") == {"paused": 24}  # paused slots are not missed
    healthy = rows["healthy-hourly"]
    assert counts("healthy-hourly") == {"completed": 23, "due": 1} and healthy.select_one(".streak").text == "0"
    assert healthy.select_one(".last .badge").text == "due"  # 12:00 has come: due, its retries still to come
    assert healthy.select_one(".last time")["datetime"] == "2030-01-08T12:00:00Z"
    assert healthy.select_one(".next time")["datetime"] == "2030-01-08T13:00:00Z"
    weekly = rows["weekly-report"]
    assert weekly.select_one(".last time")["datetime"] == "2030-01-07T06:00:00Z"  # a day and more ago
    assert weekly.select_one(".last .badge").text == "completed"
    assert weekly.select_one(".next time")["datetime"] == "2030-01-14T06:00:00Z"


@pytest.mark.slow  # a day of a per-minute job's slots: make test runs it
def test_a_per_minute_jobs_row_counts_its_whole_day(datastore, ndb_client, tmp_path, clock):
    """Issue 39 §1: a per-minute job's row counts all 1,440 slots of its last 24 hours (it counted
    its newest 288 and said since when), and a 5-minute job's its 288."""
    (tmp_path / "scheduler.yaml").write_text(
        textwrap.dedent("""
        defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
        jobs:
          pulse: {target: invoice, schedule: "* * * * *"}
          every-five: {target: invoice, schedule: "*/5 * * * *"}
        """)
    )
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    clock.advance(86400 + 30)  # a day of slots, none delivered; the newest is T0 plus a day
    page = site.get("/admin/").html
    row = page.select_one("tr.job-row[data-scheduler-job='pulse']")
    counts = {c["data-status"]: int(c["data-count"]) for c in row.select(".count")}
    assert int(row.select_one("a.expected")["data-count"]) == sum(counts.values()) == 1440
    assert counts["missed"] >= 1430 and set(counts) <= {"missed", "due"}  # due: retry windows still open
    five = page.select_one("tr.job-row[data-scheduler-job='every-five']")
    assert int(five.select_one("a.expected")["data-count"]) == 288
    # The audit's pass changes nothing here: a missed slot may be run by hand at any time, so a row
    # reads its record, never an earlier verdict (schedules.summaries: only completed runs are kept).
    site.get("/tasks/audit", headers=CRON)
    after = site.get("/admin/").html.select_one("tr.job-row[data-scheduler-job='pulse']")
    assert {c["data-status"]: int(c["data-count"]) for c in after.select(".count")} == counts
