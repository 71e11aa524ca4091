"""A step whose outcome is unknown, on the operator's page and the API (service/steps.py).

A three-step python job (tests.job_targets:stepped) whose at_most_once charge takes effect and
loses its answer: the next delivery finds it started with no result and parks the run as
needs_review.  The run page lists the steps and says which one waits, with its key; an operator
marks it done (with a result) or runs it again, and the run is reopened and resumes after its
recorded steps.  Sent twice, a decision is written once and runs once.
"""

from __future__ import annotations

import textwrap

import pytest
import webtest

from handlers import create_app
from handlers.admin import ACTION_ANSWERS
from tests import job_targets
from tests.support.callers import OFF_GAE, held, settle
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import T0, at

JOBS = """
jobs:
  billing:
    kind: python
    target: tests.job_targets:stepped
    lease_seconds: 60
    retention_seconds: 604800
  adhoc:
    kind: python
    target: tests.job_targets:stepped
    lease_seconds: 60
"""
SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  attempt_deadline: 60s
  retry: {retry_count: 3, min_backoff: 1m, max_retry_duration: 2h}
  start_at: "2030-01-01T00:00:00Z"
jobs:
  billing-hourly: {target: billing, schedule: "0 * * * *"}
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


def deliver(site, clock, hour: int = 1):
    clock.advance(max(0.0, (T0.replace(hour=hour) - clock.now()).total_seconds()) + 10)
    headers = scheduler_headers(scheduler_job_name="billing-hourly", schedule_time=at(hour))
    return site.post(f"/jobs/billing{SCOPE}", b"", headers={**headers, "X-Appengine-User-Ip": "0.1.0.2"}, status="*")


def parked(site, clock) -> str:
    """A run whose charge took effect and lost its answer, delivered again: it waits for review."""
    job_targets.LOSE_ANSWER.add("charge")
    first = deliver(site, clock)
    assert first.status_int == 500  # released: Scheduler retries
    again = deliver(site, clock)
    assert again.status_int == 422 and again.json["error"]["type"] == "NeedsReview"
    return str(first.json["run_id"])


def calls(step: str) -> int:
    return sum(1 for name, _ in job_targets.STEP_CALLS if name == step)


def test_the_run_page_shows_the_steps_and_the_one_that_waits_with_its_key(site, clock):
    run_id = parked(site, clock)
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert page.find(id="outcome").text == "needs_review"
    box = page.find(id="needs-review")
    assert "charge" in box.text and "attempt 1" in box.text and "may have taken effect" in box.text
    assert page.find(id="review-key").text == f"{run_id}:charge"
    rows = [[cell.text for cell in row.find_all("td")] for row in page.select("#steps tbody tr")]
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in rows] == [
        ("reserve", "done", "at least once", "1", f"{run_id}:reserve"),
        ("charge", "started", "at most once", "1", f"{run_id}:charge"),
    ]
    assert page.find(id="step-done") is not None and page.find(id="step-rerun") is not None
    # A viewer sees the review, not the forms.
    seen = site.get(f"/admin/runs/{run_id}", headers=VIEWER).html
    assert seen.find(id="needs-review") is not None and seen.find(id="step-done") is None
    # The API's record says the same.
    document = site.get(f"/api/v1/runs/{run_id}", headers=VIEWER).json
    assert document["needs_review"] == {"step": "charge", "attempt": 1, "key": f"{run_id}:charge"}
    assert [(s["name"], s["state"], s["attempt"]) for s in document["steps"]] == [
        ("reserve", "done", 1),
        ("charge", "started", 1),
    ]


def test_marking_the_step_done_resumes_the_run_without_calling_it_again(site, clock):
    run_id = parked(site, clock)
    form = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).forms["step-done"]
    form["result"] = '{"charge": "ch_1"}'
    form["checked"] = True
    with held(site):  # a double click while the task waits: one decision, one run
        answers = [form.submit(headers=OPERATOR, status=303) for _ in range(2)]
    assert {a.headers["Location"] for a in answers} == {f"/admin/runs/{run_id}?queued=2"}
    assert settle(site) == [200]
    record = site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json
    assert record["status"] == "completed" and record["result"]["charged"] == {"charge": "ch_1"}
    assert (calls("reserve"), calls("charge"), calls("notify")) == (1, 1, 1)
    steps = {s["name"]: s for s in record["steps"]}
    assert steps["charge"]["state"] == "done" and steps["charge"]["settled_by"] == "user:carol@example.com"
    assert steps["notify"]["attempt"] == 3
    page = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).html
    assert page.find(id="outcome").text == "completed" and page.find(id="needs-review") is None
    # The same form again, after the run: answered from the record, nothing written or run.
    resent = form.submit(headers=OPERATOR, status=409)
    assert "not waiting for a review" in resent.text
    assert calls("notify") == 1


def test_running_the_step_again_calls_it_once_more(site, clock):
    run_id = parked(site, clock)
    form = site.get(f"/admin/runs/{run_id}", headers=OPERATOR).forms["step-rerun"]
    form["checked"] = True
    assert form.submit(headers=OPERATOR, status=303).headers["Location"] == f"/admin/runs/{run_id}?queued=2"
    assert settle(site) == [200]
    assert site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json["status"] == "completed"
    assert (calls("reserve"), calls("charge"), calls("notify")) == (1, 2, 1)
    assert (ACTION_ANSWERS["started"]) in site.get(f"/admin/runs/{run_id}?queued=2", headers=OPERATOR).text


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"decision": "done", "attempt": "2"}, 400, "tick the box"),
        ({"decision": "maybe", "attempt": "2", "checked": "yes"}, 400, "decision must be done or rerun"),
        ({"decision": "done", "attempt": "2", "checked": "yes", "result": "{nope"}, 400, "must be JSON"),
        ({"decision": "done", "attempt": "2", "checked": "yes", "result": "NaN"}, 400, "must be JSON"),
        ({"decision": "done", "attempt": "x", "checked": "yes"}, 400, "attempt must be"),
        ({"decision": "done", "attempt": "1", "checked": "yes"}, 409, "attempt 2, not 1"),
        ({"decision": "rerun", "attempt": "2", "checked": "yes", "result": "1"}, 400, "takes no result"),
        ({"decision": "done", "attempt": "2", "checked": "yes", "step": "x"}, 400, "unknown form field"),
    ],
)
def test_a_bad_decision_is_refused_and_writes_nothing(site, clock, fields, status, words):
    run_id = parked(site, clock)
    refused = site.post(f"/admin/runs/{run_id}/steps/charge", fields, headers=OPERATOR, status=status)
    assert words in refused.text
    document = site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json
    assert document["status"] == "failed" and document["needs_review"]["step"] == "charge"
    assert {s["name"]: s["state"] for s in document["steps"]}["charge"] == "started"
    assert calls("charge") == 1


def test_a_decision_on_another_step_or_run_is_refused(site, clock):
    run_id = parked(site, clock)
    fields = {"decision": "done", "attempt": "2", "checked": "yes"}
    other = site.post(f"/admin/runs/{run_id}/steps/reserve", fields, headers=OPERATOR, status=409)
    assert "not 'reserve'" in other.html.get_text()
    site.post(f"/admin/runs/{'f' * 64}/steps/charge", fields, headers=OPERATOR, status=404)
    site.post(f"/admin/runs/{run_id}/steps/charge", fields, headers=VIEWER, status=403)


def test_the_api_settles_a_step_and_answers_as_a_delivery(site, clock):
    run_id = parked(site, clock)
    url = f"/api/v1/runs/{run_id}/steps/charge"
    bad = site.post_json(url, {"decision": "done", "attempt": 2, "extra": 1}, headers=OPERATOR, status=400)
    assert "unknown field" in bad.json["detail"]
    site.post_json(url, {"decision": "done", "attempt": True}, headers=OPERATOR, status=400)
    site.post(url, "not json", headers={**OPERATOR, "Content-Type": "application/json"}, status=400)
    done = site.post_json(url, {"decision": "done", "attempt": 2, "result": {"ref": "ch_9"}}, headers=OPERATOR)
    assert done.status_int == 200 and done.json["status"] == "completed"
    assert done.json["result"]["charged"] == {"ref": "ch_9"} and done.headers["X-Dedup-Run-Id"] == run_id
    again = site.post_json(url, {"decision": "rerun", "attempt": 3}, headers=OPERATOR, status=409)
    assert again.json["error"] == "StepNotWaiting"
    assert (calls("charge"), calls("notify")) == (1, 1)


def test_a_manual_runs_step_is_not_reopened_here(site, clock):
    job_targets.LOSE_ANSWER.add("charge")
    body = {"clientToken": "adhoc-1"}
    first = site.post_json("/api/v1/jobs/adhoc/runs", body, headers=OPERATOR, status="*")
    run_id = first.json["run_id"]
    site.post_json("/api/v1/jobs/adhoc/runs", body, headers=OPERATOR, status="*")
    document = site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json
    assert document["needs_review"]["step"] == "charge"
    refused = site.post_json(
        f"/api/v1/runs/{run_id}/steps/charge", {"decision": "done", "attempt": 2}, headers=OPERATOR, status=409
    )
    assert "only a scheduled slot's run" in refused.json["detail"]
    steps = site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json["steps"]
    assert [s["state"] for s in steps] == ["done", "started"]  # nothing was written


def test_a_decision_too_large_or_for_no_run_id_is_refused_before_anything_is_read(site, clock):
    run_id = parked(site, clock)
    url = f"/api/v1/runs/{run_id}/steps/charge"
    huge = {"decision": "done", "attempt": 2, "result": "щ" * 20_000}  # 120,002 bytes of JSON as stored
    assert "at most 65536 bytes" in site.post_json(url, huge, headers=OPERATOR, status=400).json["detail"]
    form = {"decision": "done", "attempt": "2", "checked": "yes", "result": '"' + "щ" * 20_000 + '"'}
    assert "at most" in site.post(f"/admin/runs/{run_id}/steps/charge", form, headers=OPERATOR, status=400).text
    site.post_json(
        f"/api/v1/runs/{'x' * 2000}/steps/charge", {"decision": "done", "attempt": 2}, headers=OPERATOR, status=404
    )
    assert site.get(f"/api/v1/runs/{run_id}", headers=OPERATOR).json["needs_review"]["step"] == "charge"
