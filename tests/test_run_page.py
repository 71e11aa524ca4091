"""Issue 25 §4: the run page says what a person needs of one run.

Its slot's time in its job's zone and how late it started, its duration with units, each
attempt, result and error apart, why it was skipped or delivered during a pause, a link to
its log lines, and the actions that apply: a failed scheduled run offers "run this slot
again", which, sent twice, runs once.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest

from handlers import create_app
from handlers.admin import ACTION_ANSWERS
from handlers.dashboard_actions import ANSWER_OF
from tests import job_targets
from tests.support.callers import OFF_GAE, held, settle, slot_confirmation, without_retries
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    retention_seconds: 604800
    max_delay_seconds: 600
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  attempt_deadline: 60s
  retry: {retry_count: 1, min_backoff: 1m, max_retry_duration: 2h}
  start_at: "2030-01-01T00:00:00Z"
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *", time_zone: Europe/Berlin}
"""
SCOPE = "?project=acme-prod&location=us-central1"
OPERATOR = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "carol@example.com"}
VIEWER = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "bob@example.com"}


@pytest.fixture
def site(google, ndb_client, tmp_path, clock, monkeypatch):
    from handlers.auth import AuthSettings

    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    auth = AuthSettings.from_environ(
        {
            **OFF_GAE,
            "DEDUP_AUTH": "appengine",
            "DEDUP_OPERATORS": "carol@example.com",
            "DEDUP_VIEWERS": "bob@example.com",
        }
    )
    app = webtest.TestApp(
        create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client, auth=auth)
    )
    app.get("/api/v1/scheduler-jobs", headers=OPERATOR)
    return app


def deliver(site, clock, hour, late_by=10):
    clock.advance((T0 + datetime.timedelta(hours=hour, seconds=late_by) - clock.now()).total_seconds())
    # Cloud Scheduler's App Engine target: the source address App Engine gives it, 0.1.0.2.
    marker = {"X-Appengine-User-Ip": "0.1.0.2"}
    headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour), **marker)
    return site.post(f"/jobs/invoice{SCOPE}", b"", headers=headers, expect_errors=True)


def test_a_failed_scheduled_run_says_when_how_late_and_why_and_runs_again_once(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent"]
    run_id = deliver(site, clock, 1, late_by=42).json["run_id"]
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert page.find(id="outcome").text == "failed"
    assert page.find(id="schedule-time").find("time").text == "2030-01-01 02:00:00 CET"  # Berlin's time
    assert page.find(id="lateness").text == "42 s after its schedule time"
    assert page.find(id="duration").text.split()[-1] in ("ms", "s")
    assert "REJECTED" in page.find(id="error").text and page.find(id="result") is None
    assert (
        f"run_id%3D%22{run_id}%22" in page.find(id="logs")["href"]
        and "project=acme-prod" in page.find(id="logs")["href"]
    )
    confirm = site.get(page.find(id="run-again")["href"], headers=OPERATOR)
    assert confirm.html.find(id="confirm-title").text == "Run this slot of invoice?"
    assert "It replaces attempt 1." in confirm.html.find(id="confirm-facts").text
    form = confirm.forms["confirm"]
    clock.advance(600)  # the operator runs it again ten minutes on
    with held(site):  # a double click, sent while the task waits in the queue: one task
        answers = [form.submit(headers=OPERATOR, status=303) for _ in range(2)]
    assert {a.headers["Location"] for a in answers} == {f"/admin/runs/{run_id}?queued=1"}
    assert settle(site) == [200]
    said = [site.get(a.headers["Location"], headers=OPERATOR).html.find(id="answer").text for a in answers]
    assert said == [ACTION_ANSWERS["started"]] * 2
    resent = form.submit(headers=OPERATOR, status=303)  # back, then resubmit, after the run
    assert (
        site.get(resent.headers["Location"], headers=OPERATOR).html.find(id="answer").text == ACTION_ANSWERS["already"]
    )
    again = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert again.find(id="answer") is None and again.find(id="refreshing") is None
    assert again.find(id="outcome").text == "completed" and again.find(id="run-again") is None
    assert again.find(id="lateness").text == "42 s after its schedule time"  # its first attempt's start
    assert [len(again.select("#attempts tbody tr"))] == [2]
    assert site.get(f"/admin/runs/{run_id}", headers=VIEWER).html.find(id="run-again") is None


def test_a_completed_run_shows_its_result_and_no_error(site, clock):
    run_id = deliver(site, clock, 2).json["run_id"]
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert '"ok": true' in page.find(id="result").text and page.find(id="error") is None
    assert page.find(id="run-again") is None  # completed: nothing to run again


def test_a_skipped_run_says_why(site, clock):
    run_id = deliver(site, clock, 3, late_by=3600).json["run_id"]  # later than max_delay_seconds
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert page.find(id="outcome").text == "skipped" and "later than" in page.find(id="reason").text


def test_a_run_delivered_during_a_pause_says_so_and_who_paused(site, clock):
    clock.advance((T0 + datetime.timedelta(hours=3.5) - clock.now()).total_seconds())
    site.post_json(
        "/api/v1/scheduler-jobs/invoice-hourly/pause", {"note": "incident 4711"}, headers=OPERATOR, status=200
    )
    run_id = deliver(site, clock, 4).json["run_id"]
    pause = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html.find(id="pause")
    assert "incident 4711" in pause.text and "carol@example.com" in pause.text and "ran as usual" in pause.text


@pytest.mark.parametrize("answer", ["", "<script>", "ran ", "RAN", "done"])
def test_only_the_known_answers_are_said(site, clock, answer):
    run_id = deliver(site, clock, 2).json["run_id"]
    page = site.get(f"/admin/runs/{run_id}", params={"answer": answer}, headers=OPERATOR)
    main = page.html.find("main")
    assert page.html.find(id="answer") is None
    assert "<script>" not in str(main) and "<script>" not in main.text  # neither as markup nor as text


def test_every_answer_an_action_gives_is_said_in_words():
    assert {*ANSWER_OF.values(), "skipped", "queued", "started", "form_used", "form_running"} == set(ACTION_ANSWERS)


def test_running_a_slot_again_that_fails_retryably_is_released_for_the_queue_to_retry(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent", "retryable"]
    without_retries(site)  # the page as it stands before the queue's retry
    run_id = deliver(site, clock, 1).json["run_id"]
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR)
    form = slot_confirmation(site, page, at(1), headers=OPERATOR)
    answer = form.submit(headers=OPERATOR, status=303)
    assert settle(site) == [500]  # released: the task is the queue's to retry
    page = site.get(answer.headers["Location"], headers=OPERATOR).html
    assert page.find(id="answer").text == ACTION_ANSWERS["started"] and page.find(id="outcome").text == "released"


def test_a_run_still_going_refreshes_its_page_and_says_so(site, clock, ndb_client):
    from dedup.keys import scheduled_run_key
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    clock.advance(5 * 3600 + 10)
    key = scheduled_run_key("invoice-hourly", at(5), query_project="acme-prod", query_location="us-central1")
    description = RunDescription(
        "scheduler", "invoice", "invoice-hourly", key.schedule_time, project="acme-prod", location="us-central1"
    )
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 604800))
    page = site.get(f"/admin/runs/{key.run_id}", headers=OPERATOR).html
    assert page.find(id="outcome").text == "in_progress"
    refreshing = page.find(id="refreshing")
    refresh = f"{refreshing['data-seconds']}; url={refreshing['data-url']}"
    assert refresh == f"5; url=/admin/runs/{key.run_id}" and page.find(id="refreshing")  # the answer is said once
    clock.advance(61)  # the lease runs out unfinished: stuck, and nothing changes it but a person or a delivery
    page = site.get(f"/admin/runs/{key.run_id}", params={"answer": "running"}, headers=OPERATOR).html
    assert page.find(id="outcome").text == "stuck"
    assert page.find(id="refreshing") is None


def test_the_day_history_link_is_the_jobs_own_day(site, clock):
    """23:00 UTC is midnight in Berlin: the run belongs to the next day of its job's history."""
    run_id = deliver(site, clock, 23).json["run_id"]
    link = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html.find(id="day-history")["href"]
    assert link.endswith("/admin/jobs/invoice/history?day=2030-01-02")
    day = site.get(link, headers=OPERATOR).html
    assert any(a["href"].endswith(run_id) for a in day.select("main a[href*='/admin/runs/']"))


def test_only_operators_are_offered_a_bulk_run(site, clock):
    job_targets.FAILURES["invoice"] = ["permanent"]
    deliver(site, clock, 2)
    day = {"day": "2030-01-01"}
    assert site.get("/admin/jobs/invoice/history", params=day, headers=OPERATOR).html.find(id="bulk-run")
    assert site.get("/admin/jobs/invoice/history", params=day, headers=VIEWER).html.find(id="bulk-run") is None
    site.get("/admin/jobs/invoice/history/run", params=day, headers=VIEWER, status=403)
