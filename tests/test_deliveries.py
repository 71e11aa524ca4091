"""Issue 38 §2: a handler of your own made exactly-once with the library: the framework-free
call (dedup.deliveries) and its Flask decorator (dedup.adapters.flask), on the emulator."""

from __future__ import annotations

import concurrent.futures
import datetime
import importlib.util
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask, Response, jsonify
from google.cloud import ndb

from dedup.adapters.flask import exactly_once
from dedup.app_engine_markers import INTERNAL_MARKERS, AppEngineCallers
from dedup.callers import Callers, FoldedHeaders
from dedup.clock import ManualClock, SystemClock
from dedup.deliveries import Deliveries, DeliverySettings, ScheduledRun
from dedup.environment import EnvironmentSettingError
from dedup.errors import PermanentJobError
from dedup.ledger import Ledger
from dedup.run_record import RunRecord
from devtools.emulator import free_port
from examples import library_flask_app
from handlers.auth.appengine import AppEngineMarkers
from handlers.auth.verifier import ForbiddenEvidence
from tests.support.callers import AUDIENCE, CALLER, issuer  # noqa: F401 - fixture
from tests.support.deliveries import scheduler_headers
from tests.support.downstream import Downstream, Reply

ROOT = Path(__file__).resolve().parent.parent
# In the past of the system clock the sample runs on: a slot's delivery, not a Force run.
WHEN = "2025-06-01T02:00:00Z"
SLOT = datetime.datetime(2025, 6, 1, 2, 0, tzinfo=datetime.UTC)
LATER = SLOT + datetime.timedelta(minutes=1)  # the clock of the tests that are not about time


def delivery(name: str = "nightly", when: str = WHEN, **extra: str) -> dict[str, str]:
    return {**scheduler_headers(scheduler_job_name=name, schedule_time=when), **extra}


@pytest.fixture
def reports() -> Iterator[Downstream]:
    """The reports service the sample calls: a recording server."""
    with Downstream() as running:
        running.default = Reply(body=b'{"id": "report-1"}')
        yield running


@pytest.fixture
def sample(ndb_client, reports, monkeypatch):
    library_flask_app.reports._client = ndb_client  # the test's emulator, as the environment names it
    # A process's memory of completed runs, as a new process has it: the emulator was wiped.
    library_flask_app.reports.ledger = Ledger(SystemClock())
    monkeypatch.setattr(library_flask_app, "REPORTS_URL", reports.url + "/v1/reports")
    return library_flask_app.app.test_client()


def test_the_sample_runs_each_execution_once_and_answers_its_duplicates_from_the_record(sample, reports):
    first = sample.post("/tasks/nightly-report", headers=delivery())
    again = sample.post("/tasks/nightly-report", headers=delivery())
    other = sample.post("/tasks/nightly-report", headers=delivery(when="2025-06-02T02:00:00Z"))
    assert [first.status_code, again.status_code, other.status_code] == [200, 200, 200]
    assert first.json["result"] == {"report": "report-1", "attempt": 1} and first.json["duplicate"] is False
    assert again.json["duplicate"] is True and again.headers["Idempotent-Replayed"] == "true"
    assert again.json["run_id"] == first.json["run_id"] == first.headers["X-Dedup-Run-Id"] != other.json["run_id"]
    assert reports.keys() == [first.json["run_id"], other.json["run_id"]]  # the view entered twice, not 3


@pytest.mark.parametrize(
    "headers, query, field",
    [
        ({}, "", "X-CloudScheduler-JobName"),
        ({"X-CloudScheduler-JobName": "nightly"}, "", "X-CloudScheduler-ScheduleTime"),
        ({"X-Appengine-Cron": "true"}, "", "X-Appengine-Cron"),
        ({"X-CloudTasks-TaskName": "task-1", "X-CloudTasks-QueueName": "q"}, "", "X-CloudTasks-TaskName"),
        ({"X-AppEngine-TaskName": "task-1", "X-AppEngine-QueueName": "q"}, "", "X-AppEngine-TaskName"),
        (delivery(when="yesterday"), "", "X-CloudScheduler-ScheduleTime"),
        (delivery(name="bad name"), "", "X-CloudScheduler-JobName"),
        (delivery(), "?project=a&project=b", "project"),
        (delivery(), "?location=Not_A_Location", "query parameter location"),
        (delivery(**{"X-Scheduler-Project": "acme-prod"}), "?project=other-one", "header X-Scheduler-Project"),
    ],
)
def test_what_is_no_scheduler_delivery_is_a_clear_400_and_records_nothing(sample, reports, headers, query, field):
    refused = sample.post("/tasks/nightly-report" + query, headers=headers)
    assert refused.status_code == 400 and refused.mimetype == "application/problem+json"
    assert refused.json["error"] == "InvalidRequest" and refused.json["field"] == field
    assert reports.requests == []


def test_the_cron_refusal_says_how_to_schedule_it_and_a_tasks_how_to_key_it(sample):
    refused = sample.post("/tasks/nightly-report", headers={"X-Appengine-Cron": "true"})
    assert "Cloud Scheduler" in refused.json["detail"] and "no schedule time" in refused.json["detail"]
    task = sample.post("/tasks/nightly-report", headers={"X-CloudTasks-TaskName": "t"}).json["detail"]
    assert "X-CloudScheduler-ScheduleTime" in task and "task's name" in task
    # A task that carries the slot it runs is that slot's delivery, its retries included.
    slot = sample.post("/tasks/nightly-report", headers={**delivery(), "X-CloudTasks-TaskName": "t"})
    assert slot.status_code == 200 and slot.json["duplicate"] is False


def app_of(deliveries: Deliveries, view) -> Flask:
    app = Flask(__name__)
    app.add_url_rule("/run", "run", exactly_once(deliveries)(view), methods=["POST"])
    return app


def test_a_permanent_failure_is_422_for_good_and_a_retryable_one_runs_again(ndb_client):
    calls: list[int] = []

    def view(run: ScheduledRun):
        calls.append(run.attempt)
        if run.scheduler_job == "broken":
            raise PermanentJobError("the report's template is gone")
        if run.attempt == 1:
            raise ConnectionError("the downstream timed out")
        return {"ok": run.attempt}

    client = app_of(Deliveries("report", client=ndb_client, clock=ManualClock(LATER)), view).test_client()
    failed = [client.post("/run", headers=delivery(name="broken")).status_code for _ in range(2)]
    assert failed == [422, 422] and calls == [1]
    released = client.post("/run", headers=delivery())
    assert released.status_code == 500 and released.json["error"] == "RetryableFailure"
    retried = client.post("/run", headers=delivery())
    assert retried.status_code == 200 and retried.json["result"] == {"ok": 2} and calls == [1, 1, 2]


def test_concurrent_deliveries_enter_the_view_once_and_the_rest_are_told_to_come_back(ndb_client):
    entered = threading.Event()
    calls: list[str] = []

    def view(run: ScheduledRun):
        calls.append(run.run_id)
        entered.set()
        time.sleep(0.5)
        return {"done": True}

    app = app_of(
        Deliveries("report", DeliverySettings(lease_seconds=30), client=ndb_client, clock=ManualClock(LATER)), view
    )

    def deliver(_):
        return app.test_client().post("/run", headers=delivery())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(deliver, range(8)))
    assert len(calls) == 1
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 409}
    busy = [a for a in answers if a.status_code == 409]
    assert all(a.json["error"] in ("RunInProgress", "RunContended") and int(a.headers["Retry-After"]) > 0 for a in busy)


def test_the_settings_scope_keeps_two_projects_jobs_of_one_name_apart(ndb_client):
    calls: list[str] = []

    def view(run: ScheduledRun):
        calls.append(f"{run.project}/{run.location}")
        return None

    for project in ("acme-prod", "acme-stage"):
        settings = DeliverySettings(project=project, location="us-central1")
        client = app_of(Deliveries("report", settings, client=ndb_client, clock=ManualClock(LATER)), view).test_client()
        answered = client.post("/run", headers=delivery())
        assert answered.status_code == 200 and answered.json["duplicate"] is False
        # A target naming half the scope keeps the settings' other half: still this project's run.
        again = client.post("/run?location=us-central1", headers=delivery())
        assert again.json["duplicate"] is True and again.json["run_id"] == answered.json["run_id"]
        # A delivery naming another scope than the settings' is refused, not run in either.
        other = client.post("/run?project=acme-other", headers=delivery())
        assert other.status_code == 400 and other.json["field"] == "the configured project"
    assert calls == ["acme-prod/us-central1", "acme-stage/us-central1"]


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"lease_seconds": 0, "retention_seconds": 60}, "lease_seconds"),
        ({"lease_seconds": -1, "retention_seconds": 60}, "lease_seconds"),
        ({"lease_seconds": 120, "retention_seconds": 60}, "lease_seconds"),
        ({"project": "Acme Prod"}, "not a Google Cloud project id"),
        ({"project": ""}, "not a Google Cloud project id"),
        ({"location": "US_CENTRAL1"}, "not a Cloud Scheduler location"),
    ],
)
def test_settings_that_cannot_hold_are_refused_at_once(fields, said):
    with pytest.raises(ValueError, match=said):
        DeliverySettings(**fields)


def test_a_force_run_is_keyed_apart_from_the_slot_its_time_names_as_the_app_keys_it(ndb_client):
    """gcloud scheduler jobs run at 01:00 may carry 02:00's time: it runs as a Force run, and
    02:00's own delivery still runs the slot; a retry of the Force run just before 02:00 is its."""
    clock = ManualClock(SLOT - datetime.timedelta(hours=1))
    calls: list[tuple[str, bool]] = []

    def view(run: ScheduledRun):
        calls.append((run.run_id, run.force_run))
        return None

    client = app_of(Deliveries("report", client=ndb_client, clock=clock), view).test_client()
    forced = client.post("/run", headers=delivery())
    clock.advance(3600 - 5)  # 01:59:55: within the skew, a retry of the Force run (which is remembered)
    retried = client.post("/run", headers=delivery())
    clock.advance(10)  # 02:00:05: the slot's own delivery
    slot = client.post("/run", headers=delivery())
    assert forced.status_code == retried.status_code == slot.status_code == 200
    assert retried.json["duplicate"] is True and retried.json["run_id"] == forced.json["run_id"]
    assert slot.json["duplicate"] is False and slot.json["run_id"] != forced.json["run_id"]
    assert calls == [(forced.json["run_id"], True), (slot.json["run_id"], False)]


def test_inside_the_callers_ndb_context_it_runs_there_unless_that_is_another_database(ndb_client):
    deliveries = Deliveries("report", client=ndb_client, clock=ManualClock(LATER))

    def work(run: ScheduledRun):
        return run.attempt

    with ndb_client.context():
        assert deliveries.answer(delivery(), work).status == 200
    other = ndb.Client(project=ndb_client.project, namespace="tenant-b")
    with other.context(), pytest.raises(RuntimeError, match="another client"):
        deliveries.answer(delivery(when="2025-06-03T02:00:00Z"), work)
    # The same client, a context of another namespace: the records would land there.
    with ndb_client.context(namespace="tenant-b"), pytest.raises(RuntimeError, match="another client"):
        deliveries.answer(delivery(when="2025-06-04T02:00:00Z"), work)
    with ndb_client.context():
        assert RunRecord.query(namespace="tenant-b").fetch(keys_only=True) == []

        @ndb.transactional()
        def inside() -> None:
            deliveries.answer(delivery(when="2025-06-05T02:00:00Z"), work)

        with pytest.raises(RuntimeError, match="inside a transaction"):
            inside()


@pytest.mark.parametrize(
    "returned, status, said",
    [
        (lambda: jsonify(sent=True), 200, None),
        (lambda: Response(b'{"error": "quota"}', 403, mimetype="application/json"), 422, "answered 403"),
        (lambda: Response(b'{"error": "busy"}', 503, mimetype="application/json"), 500, "answered 503"),
        (lambda: Response("sent", mimetype="text/plain"), 422, "text/plain response"),
        (lambda: ({"sent": True}, 201), 422, "returned a tuple"),
    ],
)
def test_what_a_view_returns_is_kept_as_json_or_refused_clearly(ndb_client, returned, status, said):
    app = app_of(Deliveries("report", client=ndb_client, clock=ManualClock(LATER)), lambda run: returned())
    with app.app_context():
        answered = app.test_client().post("/run", headers=delivery())
    assert answered.status_code == status
    if said is None:
        assert answered.json["result"] == {"sent": True}
    elif status == 500:  # released: Scheduler's retry runs it again
        assert said in answered.json["cause"]["message"] and answered.json["error"] == "RetryableFailure"
    else:
        assert said in answered.json["error"]["message"]


def test_an_async_view_without_flasks_async_extra_and_a_generator_view_are_refused_when_decorated(ndb_client):
    async def coroutine(run: ScheduledRun):
        return {"attempt": run.attempt}

    assert importlib.util.find_spec("asgiref") is None  # the locks leave Flask's async extra out
    with pytest.raises(TypeError, match=r"flask\[async\]"):
        exactly_once(Deliveries("report", client=ndb_client))(coroutine)

    def stream(run: ScheduledRun):
        yield "a"

    with pytest.raises(TypeError, match="generator"):
        exactly_once(Deliveries("report", client=ndb_client))(stream)


def test_the_default_client_reads_dedup_database_as_the_app_does(datastore, monkeypatch):
    monkeypatch.setenv("DEDUP_DATABASE", "ledger")
    assert Deliveries("report").client.database == "ledger"
    monkeypatch.setenv("DEDUP_DATABASE", "(default)")
    assert Deliveries("report").client.database is None


@pytest.mark.parametrize(
    "authorization, status, said",
    [
        (None, 401, "Authorization: Bearer"),
        (lambda issuer: "Basic abc", 401, "Authorization: Bearer"),
        (lambda issuer: "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER, rogue=True), 401, "signature"),
        (lambda issuer: "Bearer " + issuer.token(audience="https://elsewhere", email=CALLER), 401, "audience"),
        (
            lambda issuer: "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER, email_verified=False),
            401,
            "verified",
        ),
        (lambda issuer: "Bearer " + issuer.token(audience=AUDIENCE, email="someone@gmail.com"), 403, "not one of"),
        (lambda issuer: "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER.upper()), 200, None),
    ],
)
def test_with_callers_only_the_schedulers_service_account_is_run(ndb_client, issuer, authorization, status, said):
    """A Cloud Run target's Scheduler job sends an OIDC token from its service account; anyone
    else is refused before anything is recorded (a forged delivery could take a slot to come)."""
    calls: list[str] = []
    callers = Callers(AUDIENCE, [CALLER], issuer.certs_url)
    deliveries = Deliveries("report", callers=callers, client=ndb_client, clock=ManualClock(LATER))
    app = app_of(deliveries, lambda run: calls.append(run.run_id))
    headers = delivery() if authorization is None else {**delivery(), "Authorization": authorization(issuer)}
    answered = app.test_client().post("/run", headers=headers)
    assert answered.status_code == status
    if said is None:
        assert len(calls) == 1
    else:
        assert said in answered.json["detail"] and calls == [] and answered.json["instance"] == "/run"
        assert ("WWW-Authenticate" in answered.headers) == (status == 401)
        # Nothing recorded: the same delivery, from the right caller, runs as the first attempt.
        good = {**delivery(), "Authorization": "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER)}
        assert app.test_client().post("/run", headers=good).json["attempt"] == 1


def test_with_callers_a_token_that_cannot_be_checked_now_is_a_retryable_500(ndb_client, issuer):
    callers = Callers(AUDIENCE, [CALLER], f"http://127.0.0.1:{free_port()}/oauth2/v1/certs")
    app = app_of(Deliveries("report", callers=callers, client=ndb_client, clock=ManualClock(LATER)), lambda run: 1)
    headers = {**delivery(), "Authorization": "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER)}
    answered = app.test_client().post("/run", headers=headers)
    assert answered.status_code == 500 and answered.json["error"] == "InternalError" and answered.json["retryable"]
    with ndb_client.context():  # nothing ran and nothing was recorded
        assert RunRecord.query().fetch(keys_only=True) == []


@pytest.mark.parametrize(
    "audience, emails", [("", [CALLER]), (AUDIENCE, []), (AUDIENCE, ["not an email"]), (AUDIENCE, [None])]
)
def test_callers_that_admit_no_one_are_refused_at_once(audience, emails):
    with pytest.raises(ValueError):
        Callers(audience, emails)


SCHEDULER_ON_APP_ENGINE = {"X-Appengine-User-Ip": "0.1.0.2", "X-CloudScheduler": "true"}


@pytest.mark.parametrize(
    "extra, status, said",
    [
        (SCHEDULER_ON_APP_ENGINE, 200, None),
        ({"X-AppEngine-QueueName": "projects/p/locations/l/queues/q"}, 200, None),
        ({}, 403, "none of App Engine's own markers"),
        ({"X-Appengine-User-Ip": "203.0.113.9"}, 403, "none of App Engine's own markers"),
        ({"X-Appengine-User-Ip": "0.1.0.2", "X-Appengine-User-Email": "admin@example.com"}, 403, "signed-in"),
        ({"X-AppEngine-TaskName": "t1", "X-Appengine-User-Email": "viewer@example.com"}, 403, "signed-in"),
    ],
)
def test_on_app_engine_only_its_own_requests_are_run(ndb_client, extra, status, said):
    """An App Engine-target Scheduler job's delivery carries App Engine's markers, which its front
    end strips from anyone else's request, except a signed-in admin's: those are refused."""
    calls: list[str] = []
    callers = AppEngineCallers(off_app_engine_for_tests=True)
    deliveries = Deliveries("report", callers=callers, client=ndb_client, clock=ManualClock(LATER))
    answered = (
        app_of(deliveries, lambda run: calls.append(run.run_id))
        .test_client()
        .post("/run", headers={**delivery(), **extra})
    )
    assert answered.status_code == status
    if said is None:
        assert len(calls) == 1
    else:
        assert said in answered.json["detail"] and calls == [] and "WWW-Authenticate" not in answered.headers
        with ndb_client.context():
            assert RunRecord.query().fetch(keys_only=True) == []


def test_app_engine_callers_are_refused_off_app_engine_and_must_name_known_markers(monkeypatch):
    monkeypatch.delenv("GAE_ENV", raising=False)
    with pytest.raises(ValueError, match="anyone can send them"):
        AppEngineCallers()
    monkeypatch.setenv("GAE_ENV", "localdev")  # dev_appserver strips nothing
    with pytest.raises(ValueError, match="anyone can send them"):
        AppEngineCallers()
    monkeypatch.setenv("GAE_ENV", "standard")
    assert AppEngineCallers().trusted == frozenset(INTERNAL_MARKERS)
    for trusted in (frozenset(), frozenset({"admin"}), frozenset({"ip:0.1.0.3"})):
        with pytest.raises(ValueError, match="choose from"):
            AppEngineCallers(trusted=trusted)


def test_the_apps_appengine_mode_and_the_library_admit_the_same_requests():
    """One implementation: the app's verifier and the library's callers decide alike, marker by marker."""
    verifier = AppEngineMarkers(trusted_markers=frozenset(INTERNAL_MARKERS))
    library = AppEngineCallers(off_app_engine_for_tests=True)
    values = {"X-Appengine-Cron": ["true", "TRUE", "false"], "X-AppEngine-QueueName": ["q"]}
    values |= {"X-Appengine-User-Ip": ["0.1.0.2", "0.1.0.1", "10.0.0.1"], "X-AppEngine-TaskName": ["t"]}
    values |= {"X-Appengine-User-Email": ["", "a@example.com"]}
    for chosen in itertools.product(*([None, *options] for options in values.values())):
        headers = FoldedHeaders({n: v for n, v in zip(values, chosen, strict=True) if v is not None})
        try:
            admitted = verifier.identify(headers) is not None
        except ForbiddenEvidence:
            admitted = False
        assert admitted == (library.refusal(headers) is None), chosen


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, DeliverySettings()),
        (
            {"DEDUP_LEASE_SECONDS": "30", "DEDUP_RETENTION_SECONDS": "3600", "DEDUP_HEARTBEAT": "False"},
            DeliverySettings(lease_seconds=30, retention_seconds=3600, heartbeat=False),
        ),
        (
            {"DEDUP_PROJECT": " acme-prod ", "DEDUP_LOCATION": "us-central1"},
            DeliverySettings(project="acme-prod", location="us-central1"),
        ),
        ({"DEDUP_LEASE_SECONDS": "  "}, DeliverySettings()),
    ],
)
def test_a_handlers_settings_come_from_its_environment(environ, expected):
    assert DeliverySettings.from_environment(environ) == expected


@pytest.mark.parametrize(
    "environ, named",
    [
        ({"DEDUP_LEASE_SECONDS": "ten"}, "DEDUP_LEASE_SECONDS"),
        ({"DEDUP_LEASE_SECONDS": "nan"}, "DEDUP_LEASE_SECONDS"),
        ({"DEDUP_LEASE_SECONDS": "inf"}, "DEDUP_LEASE_SECONDS"),
        ({"DEDUP_RETENTION_SECONDS": "-5"}, "DEDUP_RETENTION_SECONDS"),
        ({"DEDUP_HEARTBEAT": "yes"}, "DEDUP_HEARTBEAT"),
        ({"DEDUP_LEASE_SECONDS": "700000", "DEDUP_RETENTION_SECONDS": "600"}, "lease_seconds"),
        ({"DEDUP_PROJECT": "Acme Prod"}, "project"),
        ({"DEDUP_LOCATION": "../x"}, "location"),
        ({"DEDUP_LEASE_SECONDS": "1e-7"}, "lease_seconds"),
        ({"DEDUP_RETENTION_SECONDS": "1e12"}, "retention_seconds"),
    ],
)
def test_an_unreadable_environment_setting_is_refused_naming_it(environ, named):
    with pytest.raises(EnvironmentSettingError, match=named):
        DeliverySettings.from_environment(environ)


def test_deliveries_made_without_settings_take_the_environments(monkeypatch):
    monkeypatch.setenv("DEDUP_LEASE_SECONDS", "45")
    assert Deliveries("report").settings.lease_seconds == 45
    assert Deliveries("report", DeliverySettings(lease_seconds=5)).settings.lease_seconds == 5  # code wins
    monkeypatch.setenv("DEDUP_HEARTBEAT", "maybe")
    with pytest.raises(EnvironmentSettingError, match="DEDUP_HEARTBEAT"):
        Deliveries("report")


def test_the_caller_is_checked_before_the_request_is_read(ndb_client, issuer):
    """A caller who is not admitted learns nothing of what the handler would accept: 401, not the 400
    a malformed delivery (a scope named twice) gets from an admitted one."""
    callers = Callers(AUDIENCE, [CALLER], issuer.certs_url)
    app = app_of(Deliveries("report", callers=callers, client=ndb_client, clock=ManualClock(LATER)), lambda run: 1)
    twice = "/run?project=a-project&project=b-project"
    assert app.test_client().post(twice, headers=delivery()).status_code == 401
    assert app.test_client().post("/run", headers={"X-CloudScheduler-JobName": "x"}).status_code == 401
    signed = {**delivery(), "Authorization": "Bearer " + issuer.token(audience=AUDIENCE, email=CALLER)}
    refused = app.test_client().post(twice, headers=signed)
    assert refused.status_code == 400 and refused.json["field"] == "project"


def test_a_decorated_view_gets_steps_that_resume_after_a_release(ndb_client):
    """The library's handlers have the app's steps: attempt 2 resumes after attempt 1's recorded step."""
    calls: list[tuple[str, int, str]] = []

    def view(run: ScheduledRun):
        exported = run.step("export", lambda key: calls.append(("export", run.attempt, key)) or {"rows": 3})
        if run.attempt == 1:
            raise RuntimeError("the mail service is down")  # retryable: the run is released
        run.step(
            "mail", lambda key: calls.append(("mail", run.attempt, key)), semantic="at_most_once", on_unknown="review"
        )
        return exported

    deliveries = Deliveries("steps", client=ndb_client, clock=ManualClock(LATER))
    client = app_of(deliveries, view).test_client()
    assert client.post("/run", headers=delivery(name="stepped")).status_code == 500
    done = client.post("/run", headers=delivery(name="stepped"))
    assert done.status_code == 200 and done.json["result"] == {"rows": 3}
    run_id = done.json["run_id"]
    assert calls == [("export", 1, f"{run_id}:export"), ("mail", 2, f"{run_id}:mail")]
    with ndb_client.context():
        record = RunRecord.get_by_id(run_id)
    assert {name: entry["attempt"] for name, entry in record.steps.items()} == {"export": 1, "mail": 2}
