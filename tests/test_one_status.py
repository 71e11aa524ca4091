"""Issue 25 §3: one status, everywhere.

A day of runs in every status a run can be shown with (completed, failed, late, missed
through a release and through a stuck lease, stuck, in progress, overdue, a delivery
during a pause, a Force run, a manual run) and a slot paused with no run.  Each run's
status is then read from every view that shows it: the executions API (its slot, or its
entry apart from the slots), the dashboard's runs table, the timeline's mark, its job's
card and the run's own page.  They must all say the same (schedules.slots.run_status).
"""

from __future__ import annotations

import datetime
import textwrap

import webtest

from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from handlers import create_app
from handlers.admin import LEGEND, MARK_SHAPES
from schedules.slots import ExecutionStatus
from tests import job_targets
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    retention_seconds: 604800
  digest:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
    retention_seconds: 604800
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  attempt_deadline: 60s
  retry: {retry_count: 1, min_backoff: 1m, max_retry_duration: 30m}
  start_at: "2030-01-01T00:00:00Z"
jobs:
  invoice-hourly:
    target: invoice
    schedule: "0 * * * *"
    finish_within: 20m
  digest-half-past:
    target: digest
    schedule: "30 * * * *"
    finish_within: 5m
"""
SCOPE = "?project=acme-prod&location=us-central1"


def test_every_view_says_the_same_status_of_every_run(google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)  # the pause, in Cloud Scheduler's stand-in
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    site.get("/api/v1/scheduler-jobs")

    def move(hour: float, seconds: float = 0) -> None:
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=seconds) - clock.now()).total_seconds())

    def deliver(job: str, name: str, hour: float, status: int | str = "*"):
        headers = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour))
        return site.post(f"/jobs/{job}{SCOPE}", b"", headers=headers, status=status)

    def hold(job: str, name: str, hour: float, lease: float) -> None:
        """A delivery's claim whose attempt never finishes (a worker gone): in progress, then stuck."""
        key = scheduled_run_key(name, at(hour), query_project="acme-prod", query_location="us-central1")
        description = RunDescription(
            "scheduler", job, name, key.schedule_time, project="acme-prod", location="us-central1"
        )
        with ndb_client.context():
            Ledger(clock).claim_run(key.run_id, description, RunPolicy(lease, 604800))

    move(0, 10)
    deliver("invoice", "invoice-hourly", 0)  # completed
    job_targets.FAILURES["invoice"] = ["permanent"]
    move(1, 10)
    deliver("invoice", "invoice-hourly", 1)  # failed
    move(2, 25 * 60)
    deliver("invoice", "invoice-hourly", 2)  # late: completed after its 20 minutes
    job_targets.FAILURES["invoice"] = ["retryable"]
    move(3, 10)
    deliver("invoice", "invoice-hourly", 3)  # released, never retried: missed once the window closes
    move(4, 10)
    hold("invoice", "invoice-hourly", 4, 60)  # stuck, and still stuck once the window closes: it started
    move(4, 50 * 60)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident"})
    move(5, 10)
    deliver("invoice", "invoice-hourly", 5)  # a tick racing the pause runs, and says so
    move(6, 40 * 60)  # 06:00 passes inside the pause, undelivered: paused
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/resume", {"catch_up": "none"})
    move(6.5, 10)
    hold("digest", "digest-half-past", 6.5, 7200)  # live past its 5 minutes: overdue
    move(7, 10)
    hold("invoice", "invoice-hourly", 7, 60)  # its lease runs out inside the window: stuck
    move(7, 5 * 60)
    forced = deliver("invoice", "invoice-hourly", 7 + 5 / 60 + 0.0001).json["run_id"]  # a Force run, its own time
    manual = site.post_json("/api/v1/jobs/digest/runs", {"clientToken": "by-hand"}).json["run_id"]
    with ndb_client.context():  # a manual run still going
        Ledger(clock).claim_run("e" * 64, RunDescription("api", "digest", client_token="t-2"), RunPolicy(3600, 604800))
    move(7, 10 * 60)  # 07:10

    # The executions API: each slot's status, and the runs apart from the slots.
    said: dict[str, dict[str, str]] = {}
    for job in ("invoice", "digest"):
        listing = site.get(f"/api/v1/jobs/{job}/executions", params={"since": at(0), "until": at(7.2)}).json
        for e in listing["executions"]:
            if "run" in e:
                said.setdefault(e["run_id"], {})["executions API"] = e["status"]
            elif e["status"] == "paused":
                assert e["schedule_time"] == at(6)  # the undelivered slot of the pause
        for run in listing["unscheduled"]:
            said.setdefault(run["run_id"], {})["executions API"] = "stuck" if run["stuck"] else run["status"]
    page = site.get("/admin/")
    for tr in page.html.select("tr.run-row"):
        run_id = tr.find("a")["href"].rsplit("/", 1)[1]
        said.setdefault(run_id, {})["runs table"] = tr["data-outcome"]
    digest_row = page.html.select_one("tr.job-row[data-scheduler-job='digest-half-past']")
    assert digest_row["data-attention"] == "yes" and digest_row.select_one(".count[data-status='overdue']")
    for line in page.html.select(".job-card .held"):  # a card's running and stuck runs
        said.setdefault(line.find("a")["href"].rsplit("/", 1)[1], {})["job card"] = line["data-outcome"]
    for run_id, views in said.items():
        views["run page"] = site.get(f"/admin/runs/{run_id}").html.find(id="outcome").text.strip()

    # The audit reports the stuck 04:00 once, as stuck: never "overdue" (or "slow") beside it.
    audited = site.get("/tasks/audit", headers={"X-Appengine-Cron": "true"}).json
    assert [m["schedule_time"] for m in audited["stuck"]] == [at(4)]
    assert not [b for b in audited["breaches"] if b.get("schedule_time") == at(4)]
    statuses = {run_id: set(views.values()) for run_id, views in said.items()}
    disagree = {run_id: views for run_id, views in said.items() if len(statuses[run_id]) != 1}
    assert disagree == {}
    shown = sorted(status for [status] in map(tuple, statuses.values()))
    assert shown == sorted(
        [
            "completed",  # 00:00
            "failed",  # 01:00
            "late",  # 02:00
            "missed",  # 03:00, released and never retried
            "stuck",  # 04:00, stuck with nothing to take it over (never "missed": it started)
            "completed",  # 05:00, delivered during the pause
            "overdue",  # digest 06:30
            "stuck",  # 07:00
            "completed",  # the Force run
            "completed",  # the manual run
            "in_progress",  # the manual run still going
        ]
    )
    # Every view saw each run it shows: the table and the run page all of them, the API all of them.
    assert all({"executions API", "runs table", "run page"} <= set(views) for views in said.values())
    assert said[forced]["executions API"] == "completed" and said[manual]["runs table"] == "completed"
    # A card lists its running and stuck runs as the rest say: the overdue digest, 04:00, 07:00, the manual run.
    cards = sorted(views["job card"] for views in said.values() if "job card" in views)
    assert cards == ["in_progress", "overdue", "stuck", "stuck"]
    # The runs table's filter finds a run by the status every view shows it with, derived ones
    # too (review of issue 25: ?status=stuck was a 400, ?status=in_progress listed stuck runs).
    for status in set(shown):
        listed = site.get("/admin/", params={"status": status}).html.select("tr.run-row")
        expected = {run_id for run_id, views in said.items() if views["runs table"] == status}
        assert {tr.find("a")["href"].rsplit("/", 1)[1] for tr in listed} == expected, status
    upcoming = site.get("/admin/", params={"status": "upcoming"}).html  # only a slot with no run is upcoming
    assert upcoming.select("tr.run-row") == []
    assert "history shows its upcoming slots" in upcoming.find(id="slot-only").text


def test_every_status_has_a_shape_of_its_own():
    """A run's mark says its slot's status, so every status can be a mark: each has a shape,
    no two share one, and the legend lists exactly them."""
    assert {str(status) for status in ExecutionStatus} <= set(MARK_SHAPES)
    assert [status for status, _ in LEGEND] == list(MARK_SHAPES)
    assert len(set(MARK_SHAPES.values())) == len(MARK_SHAPES)


SHORT_MEMORY_JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    lease_seconds: 60
    retention_seconds: 14400
  digest:
    kind: python
    target: tests.job_targets:record
"""


def test_slots_without_a_run_say_the_same_in_the_api_the_history_and_the_home_row(
    google, ndb_client, tmp_path, clock, monkeypatch
):
    """Paused, unknown past retention, missed, due and upcoming: no run to look at, so the slot views
    (the executions API, a day's history, the home row's last execution) must agree by the slot alone."""
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(SHORT_MEMORY_JOBS))
    site = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    site.get("/api/v1/scheduler-jobs")
    clock.advance(10)
    site.post(
        f"/jobs/invoice{SCOPE}",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(0)),
    )
    clock.advance(5 * 3600)  # 05:00:10: 00:00 ran and has expired since; 01:00 to 05:00 never came
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident"})
    clock.advance(2 * 3600)  # 07:00:10: 06:00 and 07:00 lie in the pause; up to 03:00 is past the 4 h memory
    listing = site.get(
        "/api/v1/jobs/invoice/executions",
        params={"since": at(0), "until": at(9), **{"scheduler_job": "invoice-hourly"}},
    ).json["executions"]
    api = {e["schedule_time"]: e["status"] for e in listing}
    page = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).html
    history = {tr["data-schedule-time"]: tr["data-status"] for tr in page.select("tr.slot-row")}
    assert {t: history[t] for t in api} == api
    assert {"unknown", "missed", "paused", "upcoming"} <= set(api.values())
    row = site.get("/admin/").html.select_one("tr.job-row[data-scheduler-job='invoice-hourly']")
    last = row.select_one(".last time")["datetime"].replace("Z", ".000000Z")
    assert row.select_one(".last .badge").text == api[last]
