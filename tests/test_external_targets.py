"""Issue 38 §3: one ledger, one dashboard.  A handler served elsewhere with the library (an
``external`` job of jobs.yaml) writes the records this app reads: its Scheduler job's slots are
listed, and an operator's run of a missed slot is a Cloud Tasks HTTP task to the handler, with
an OIDC token and the slot's Scheduler headers, which the handler runs under the slot's own key,
so Scheduler's own delivery of that slot is then a duplicate.  What this app cannot do for such
a job (run it itself, a manual run, reopen a failed slot) is refused saying why, and nothing is
recorded."""

from __future__ import annotations

import datetime
import json
import threading
import urllib.parse
from collections.abc import Iterator

import pytest
import requests
from flask import Flask
from werkzeug.serving import make_server

from dedup.adapters.flask import exactly_once
from dedup.deliveries import Deliveries, ScheduledRun
from dedup.errors import PermanentJobError
from dedup.run_record import RunRecord
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from schedules.config import dedup_problems, parse_scheduler_document
from tests.support.schedule_sites import CRON, T0, at, schedule_site

CALLER = "nightly-caller@acme-prod.iam.gserviceaccount.com"
SCOPE = {"project": "acme-prod", "location": "us-central1"}
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, start_at: 2030-01-01T00:00:00Z, attempt_deadline: 60s}
jobs:
  reports-hourly: {target: reports, schedule: "0 * * * *"}
"""


def jobs_yaml(url: str) -> str:
    return f"""
jobs:
  reports:
    kind: external
    url: {url}
    service_account: {CALLER}
    lease_seconds: 60
"""


class Handler:
    """A team's own Flask handler, made exactly-once by the library, served on a real port."""

    def __init__(self, client, clock) -> None:
        self.effects: list[tuple[str, int]] = []
        self.failing: set[datetime.datetime] = set()  # schedule times whose run fails for good
        app = Flask("reports")
        reports = Deliveries("reports", client=client, clock=clock)

        @app.post("/tasks/nightly-report")
        @exactly_once(reports)
        def nightly_report(run: ScheduledRun) -> dict[str, object]:
            if run.schedule_time in self.failing:
                raise PermanentJobError("the report's template is gone")
            self.effects.append((run.run_id, run.attempt))
            return {"sent": True}

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/tasks/nightly-report"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def deliver(self, when: str) -> requests.Response:
        """Cloud Scheduler's delivery of a slot: the job's URI (with the scope) and its headers."""
        headers = {"X-CloudScheduler-JobName": "reports-hourly", "X-CloudScheduler-ScheduleTime": when}
        return requests.post(f"{self.url}?{urllib.parse.urlencode(SCOPE)}", headers=headers, timeout=30)


@pytest.fixture
def handler(ndb_client, clock) -> Iterator[Handler]:
    served = Handler(ndb_client, clock)
    yield served
    served.server.shutdown()


@pytest.fixture
def site(cloud_tasks, google, ndb_client, handler, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    return schedule_site(tmp_path, jobs_yaml(handler.url), SCHEDULES, clock, ndb_client)


def statuses(site, first: float, last: float) -> dict[str, str]:
    page = site.get("/api/v1/jobs/reports/executions", params={"since": at(first), "until": at(last)}).json
    return {e["schedule_time"]: e["status"] for e in page["executions"]}


def test_the_handlers_runs_are_listed_and_a_missed_slot_runs_in_the_handler_under_its_key(
    site, handler, cloud_tasks, clock, ndb_client
):
    clock.advance(3 * 3600 + 10)
    assert handler.deliver(at(1)).json()["duplicate"] is False  # Scheduler's own delivery, to the handler
    assert statuses(site, 1, 2.5) == {at(1): "completed", at(2): "missed"}
    card = site.get("/admin/").html.select_one(".job-card[data-job='reports']")
    assert card.select_one("a.run-now") is None and handler.url in card.select_one(".runs-elsewhere").text
    link = next(a["href"] for a in card.select("a.run-slot") if at(2) in urllib.parse.unquote(a["href"]))
    form = site.get(link).forms["confirm"]
    for _ in range(2):  # a double click: one task
        form.submit(headers=SAME_ORIGIN, status=303)
    [task] = cloud_tasks.tasks
    assert task.url == f"{handler.url}?{urllib.parse.urlencode(SCOPE)}" and task.relative_uri == ""
    assert task.oidc == {"serviceAccountEmail": CALLER, "audience": handler.url}
    assert task.headers["X-CloudScheduler-JobName"] == "reports-hourly"
    assert task.headers["X-CloudScheduler-ScheduleTime"] == at(2)
    cloud_tasks.deliver(lambda task, headers: 0, times=2)  # delivered twice: one run
    assert statuses(site, 1, 2.5) == {at(1): "completed", at(2): "completed"}
    late = handler.deliver(at(2))  # Scheduler's retry of the slot the operator ran: the same execution
    assert late.status_code == 200 and late.json()["duplicate"] is True
    assert [attempt for _, attempt in handler.effects] == [1, 1] and len({key for key, _ in handler.effects}) == 2
    with ndb_client.context():
        records = {r.schedule_time: r for r in RunRecord.query().fetch()}
    assert {r.job_id for r in records.values()} == {"reports"}
    assert records[T0.replace(hour=2)].key.id() == late.json()["run_id"]


def test_what_this_app_cannot_do_for_an_external_job_is_refused_and_records_nothing(
    site, handler, cloud_tasks, clock, ndb_client
):
    clock.advance(3 * 3600 + 10)
    delivery = {"X-CloudScheduler-JobName": "reports-hourly", "X-CloudScheduler-ScheduleTime": at(3)}
    refused = site.post("/jobs/reports?project=acme-prod&location=us-central1", b"", headers=delivery, status=422)
    assert refused.json["error"] == "RunsElsewhere" and handler.url in refused.json["detail"]
    manual = site.post_json("/api/v1/jobs/reports/runs", {"clientToken": "by-hand"}, status=422).json
    assert manual["error"] == "RunsElsewhere"
    confirm = site.get("/admin/jobs/reports/run", status=422)
    assert "own handler" in confirm.text
    # A slot-run task for it (one queued before the job became external) is settled, not retried.
    body = {"job_id": "reports", "schedule_time": at(3), "scheduler_job": "reports-hourly", **SCOPE}
    task = {**body, "attempt": 0, "requested_by": "someone"}
    settled = site.post_json("/tasks/run-slot", task, headers={"X-AppEngine-QueueName": "q"}, status=200).json
    assert settled["settled"] is True and settled["status"] == 422 and settled["answer"]["error"] == "RunsElsewhere"
    with ndb_client.context():
        assert RunRecord.query().fetch(keys_only=True) == []
    # The executions API queues the slot for the handler (202), as the dashboard does.
    queued = site.post(f"/api/v1/jobs/reports/executions/{at(3)}/run", "", status=202).json
    assert queued["queued"] is True and queued["already"] is False and queued["attempt"] == 0
    [sent] = cloud_tasks.tasks
    assert sent.url.startswith(handler.url) and sent.dispatch_deadline == "60s"  # the job's attempt deadline
    assert site.post(f"/api/v1/jobs/reports/executions/{at(3)}/run", "", status=202).json["already"] is True
    cloud_tasks.reset()
    # A slot the handler ran is answered from its record, wherever it is asked.
    handler.deliver(at(1))
    done = {"X-CloudScheduler-JobName": "reports-hourly", "X-CloudScheduler-ScheduleTime": at(1)}
    replayed = site.post("/jobs/reports?project=acme-prod&location=us-central1", b"", headers=done, status=200)
    assert replayed.json["duplicate"] is True and len(handler.effects) == 1
    # A failed slot stays failed: the handler answers its deliveries from the record.
    handler.failing.add(T0 + datetime.timedelta(hours=2))
    assert handler.deliver(at(2)).status_code == 422
    card = site.get("/admin/").html.select_one(".job-card[data-job='reports']")
    link = next(a["href"] for a in card.select("a.run-slot") if at(2) in urllib.parse.unquote(a["href"]))
    again = site.get(link).forms["confirm"].submit(headers=SAME_ORIGIN, status=422)
    assert "reopens no slot" in again.text and cloud_tasks.tasks == []


def external_jobs(**keys: object) -> str:
    settings = {"kind": "external", "url": "https://reports-abc-uc.a.run.app/tasks/nightly", "service_account": CALLER}
    return json.dumps({"jobs": {"reports": {**settings, **keys}}})


@pytest.mark.parametrize(
    "keys, field",
    [
        ({"url": "http://reports.internal/tasks/nightly"}, "url"),
        ({"url": "reports-abc-uc.a.run.app"}, "url"),
        ({"service_account": "not an email"}, "service_account"),
        ({"service_account": None}, "service_account"),
        ({"overlap": "forbid"}, "overlap"),
        ({"max_delay_seconds": 60}, "max_delay_seconds"),
        ({"fingerprint_exclude": ["region"]}, "fingerprint_exclude"),
        ({"audience": ""}, "audience"),
        ({"target": "tests.job_targets:record"}, "target"),
    ],
)
def test_an_external_job_that_could_not_be_reached_or_keyed_is_refused_naming_the_field(keys, field):
    with pytest.raises(JobsConfigError) as refused:
        parse_jobs(external_jobs(**keys))
    assert refused.value.field == field


def test_an_external_job_declares_where_its_handler_is():
    job = parse_jobs(external_jobs(audience="https://reports-abc-uc.a.run.app"))["reports"]
    target = job.runner.external
    assert target is not None and target.service_account == CALLER and target.audience.endswith(".run.app")
    assert target.delivery_url("acme-prod", "us-central1", True).endswith("?project=acme-prod&location=us-central1")
    assert target.delivery_url("acme-prod", "us-central1", False) == target.url
    assert parse_jobs(external_jobs())["reports"].runner.external.audience == target.url  # the url, by default


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"pass_scope": False}, "pass_scope"),
        ({"attempt_deadline": "45m"}, "attempt_deadline"),
        ({"service": "worker"}, "service"),
        (
            {
                "pass_scope": False,
                "headers": {"X-Scheduler-Project": "acme-prod", "X-Scheduler-Location": "us-central1"},
            },
            None,
        ),
    ],
)
def test_an_external_jobs_scheduler_job_must_carry_its_scope_and_fit_an_http_target(extra, field):
    document = {
        "defaults": {"project": "acme-prod", "location": "us-central1"},
        "jobs": {"reports-hourly": {"target": "reports", "schedule": "0 * * * *", **extra}},
    }
    problems = dedup_problems(parse_scheduler_document(document), parse_jobs(external_jobs(lease_seconds=3600)))
    assert [problem.field for problem in problems] == ([field] if field else [])
    # The scope in the headers beside one in the url's own query: every delivery would be refused.
    url = "https://reports-abc-uc.a.run.app/tasks/nightly?location=europe-west1"
    if field is None:
        clash = dedup_problems(
            parse_scheduler_document(document), parse_jobs(external_jobs(url=url, lease_seconds=3600))
        )
        assert [problem.field for problem in clash] == ["pass_scope"]


def test_the_audits_misfire_policy_sends_missed_slots_to_the_handler(
    cloud_tasks, google, ndb_client, handler, tmp_path, clock, monkeypatch
):
    """Alerts and catch-up read the handler's records as the app's own: the audit finds 00:00 to
    04:00 missed, and run_latest sends 04:00 to the handler, once however often the audit runs."""
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    schedules = SCHEDULES.replace('schedule: "0 * * * *"}', 'schedule: "0 * * * *", misfire: run_latest}')
    site = schedule_site(tmp_path, jobs_yaml(handler.url), schedules, clock, ndb_client)
    clock.advance(5 * 3600 + 180)
    handler.deliver(at(1))  # one slot the handler ran: not missed
    answer = site.get("/tasks/audit", headers=CRON).json
    assert [s["schedule_time"] for s in answer["caught_up"]] == [at(4)]
    assert [s["schedule_time"] for s in answer["missed"]] == [at(0), at(2), at(3)]
    [task] = cloud_tasks.tasks
    assert task.url.startswith(handler.url) and task.headers["X-CloudScheduler-ScheduleTime"] == at(4)
    cloud_tasks.deliver(lambda task, headers: 0, times=2)
    assert len(handler.effects) == 2  # 01:00 by Scheduler, 04:00 by the task (delivered twice: once)
    again = site.get("/tasks/audit", headers=CRON).json
    assert again["caught_up"] == [] and len(cloud_tasks.tasks) == 1
    assert statuses(site, 0, 4.5)[at(4)] == "completed"
