"""The /jobs/<job_id> contract through the Flask app (webtest) on the real emulator."""

from __future__ import annotations

import threading

import pytest

from tests import job_targets
from tests.support.deliveries import JOBS, T0, deliver, scheduler_headers


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def test_first_delivery_runs_the_job_and_stores_the_result(client):
    response = deliver(client, status=200)
    assert response.json["status"] == "completed"
    assert response.json["duplicate"] is False
    assert response.json["attempt"] == 1
    assert response.json["result"] == {"done": True, "attempt": 1}
    assert response.json["schedule_time"] == "2025-10-17T23:50:00.000000Z"
    assert len(job_targets.EFFECTS) == 1
    assert "Idempotent-Replayed" not in response.headers


def test_duplicate_after_completion_replays_without_running(client):
    first = deliver(client, status=200)
    again = deliver(client, status=200)
    assert again.json["duplicate"] is True
    assert again.json["result"] == first.json["result"]
    assert again.json["run_id"] == first.json["run_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(job_targets.EFFECTS) == 1


def test_get_is_served_like_post(client):
    client.get("/jobs/invoice", headers=scheduler_headers(), status=200)
    response = client.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert response.json["duplicate"] is True
    assert len(job_targets.EFFECTS) == 1


def test_header_names_are_case_insensitive(client):
    deliver(client, status=200)
    response = client.post(
        "/jobs/invoice",
        headers={"x-cloudscheduler-jobname": "nightly-invoice", "X-CLOUDSCHEDULER-SCHEDULETIME": T0},
        status=200,
    )
    assert response.json["duplicate"] is True


def test_new_schedule_time_is_a_new_run(client):
    deliver(client, status=200)
    deliver(client, schedule_time="2025-10-18T23:50:00Z", status=200)
    assert len(job_targets.EFFECTS) == 2


def test_two_spellings_of_one_instant_are_one_run(client):
    first = deliver(client, schedule_time="2025-10-17T23:50:00.510855Z", status=200)
    second = deliver(client, schedule_time="2025-10-17T16:50:00.510855-07:00", status=200)
    third = deliver(client, schedule_time="2025-10-18T01:50:00.510855+02:00", status=200)
    assert second.json["duplicate"] is True and third.json["duplicate"] is True
    assert first.json["run_id"] == second.json["run_id"] == third.json["run_id"]
    assert len(job_targets.EFFECTS) == 1


@pytest.mark.parametrize("value", [0, {}, [], None, False, ""])
def test_falsy_results_are_stored_and_replayed(client, value):
    import json

    body = json.dumps({"value": value}).encode()
    first = deliver(client, job="values", body=body, status=200)
    again = deliver(client, job="values", body=body, status=200)
    assert first.json["result"] == value and again.json["result"] == value
    assert "result" in again.json
    assert again.json["duplicate"] is True
    assert len(job_targets.EFFECTS) == 1


def test_scopes_never_collide(client):
    runs = set()
    for query in (
        "",
        "?project=alpha-project&location=us-central1",
        "?project=beta-project&location=us-central1",
        "?project=alpha-project&location=europe-west1",
    ):
        response = client.post(f"/jobs/invoice{query}", headers=scheduler_headers(), status=200)
        assert response.json["duplicate"] is False
        runs.add(response.json["run_id"])
    assert len(runs) == 4
    assert len(job_targets.EFFECTS) == 4


def test_scope_from_query_headers_and_full_job_name_is_one_run(client):
    first = client.post(
        "/jobs/invoice?project=alpha-project&location=us-central1", headers=scheduler_headers(), status=200
    )
    second = client.post(
        "/jobs/invoice",
        headers=scheduler_headers(**{"X-Scheduler-Project": "alpha-project", "X-Scheduler-Location": "us-central1"}),
        status=200,
    )
    third = client.post(
        "/jobs/invoice",
        headers=scheduler_headers(
            scheduler_job_name="projects/alpha-project/locations/us-central1/jobs/nightly-invoice"
        ),
        status=200,
    )
    assert first.json["run_id"] == second.json["run_id"] == third.json["run_id"]
    assert second.json["duplicate"] and third.json["duplicate"]
    assert job_targets.EFFECTS[0]["project"] == "alpha-project"
    assert job_targets.EFFECTS[0]["location"] == "us-central1"


def test_permanent_failure_is_stored_and_replayed(client):
    job_targets.FAILURES["flaky"] = ["permanent"]
    first = deliver(client, job="flaky", status=422)
    assert first.json["status"] == "failed"
    assert first.json["error"]["type"] == "PermanentJobError"
    assert first.json["error"]["message"] == "the invoice was rejected"
    assert first.json["error"]["details"] == {"code": "REJECTED"}
    again = deliver(client, job="flaky", status=422)
    assert again.json["duplicate"] is True
    assert again.json["error"] == first.json["error"]
    assert len(job_targets.EFFECTS) == 1


@pytest.mark.parametrize("failure", ["retryable", "crash"])
def test_retryable_failure_releases_the_claim_and_the_retry_runs(client, failure):
    job_targets.FAILURES["flaky"] = [failure]
    failed = deliver(client, job="flaky", status=500)
    assert failed.json["error"] == "RetryableFailure"
    assert failed.json["run_status"] == "released"
    assert failed.headers["X-Dedup-Run-Id"] == failed.json["run_id"]
    retried = deliver(client, job="flaky", status=200)
    assert retried.json["duplicate"] is False
    # The record was kept (released), so the retry is attempt 2.
    assert retried.json["attempt"] == 2
    assert len(job_targets.EFFECTS) == 2


@pytest.mark.parametrize("bad", ["bad-result", "deep-result"])
def test_unserialisable_result_is_a_permanent_failure_not_a_rerun(client, bad):
    job_targets.FAILURES["flaky"] = [bad]
    response = deliver(client, job="flaky", status=422)
    assert response.json["error"]["type"] == "InvalidResult"
    deliver(client, job="flaky", status=422)
    assert len(job_targets.EFFECTS) == 1


def _start_in_thread(client, gate_name, results, **headers):
    def run():
        results.append(deliver(client, job="slow", body=gate_name.encode(), **headers))

    thread = threading.Thread(target=run)
    thread.start()
    started = None
    for _ in range(200):
        started = job_targets.STARTED.get(gate_name)
        if started is not None:
            break
        threading.Event().wait(0.05)
    assert started is not None and started.wait(10), "the job never started"
    return thread


def test_live_lease_answers_409_with_retry_after(client, clock):
    results = []
    thread = _start_in_thread(client, "g1", results)
    clock.advance(20)
    busy = deliver(client, job="slow", body=b"g1", status=409)
    assert busy.json["error"] == "RunInProgress"
    assert busy.headers["Retry-After"] == "40"
    assert busy.headers["X-Dedup-Run-Id"] == busy.json["run_id"]
    assert busy.json["attempt"] == 1
    job_targets.GATES["g1"].set()
    thread.join(10)
    assert results[0].status_int == 200
    assert len(job_targets.EFFECTS) == 1


def test_expired_lease_is_taken_over_and_the_stale_attempt_changes_nothing(client, clock):
    results = []
    first = _start_in_thread(client, "g1", results)
    clock.advance(61)  # attempt 1's 60 s lease is over
    job_targets.GATES.setdefault("g2", threading.Event()).set()
    # The second delivery carries another gate name in its body, but the run
    # (job name + schedule time) is the same: it takes over as attempt 2.
    takeover = deliver(client, job="slow", body=b"g2", status=200)
    assert takeover.json["attempt"] == 2
    assert takeover.json["result"] == {"gate": "g2", "attempt": 2}
    job_targets.GATES["g1"].set()
    first.join(10)
    stale = results[0]
    assert stale.status_int == 409
    assert stale.json["error"] == "StaleAttempt"
    assert stale.json["attempt"] == 1 and stale.json["current_attempt"] == 2
    assert stale.headers["Retry-After"] == "1"
    replay = deliver(client, job="slow", body=b"g3", status=200)
    assert replay.json["duplicate"] is True
    assert replay.json["result"] == {"gate": "g2", "attempt": 2}


@pytest.mark.slow
def test_datastore_down_is_a_500_and_no_job_runs_without_a_claim(jobs_file, clock, monkeypatch, datastore):
    import webtest
    from google.cloud import ndb

    from devtools.emulator import free_port
    from handlers import create_app

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", f"127.0.0.1:{free_port()}")  # nothing listens
    dead = ndb.Client(project=datastore.project)
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=dead))
    response = app.post("/jobs/invoice", headers=scheduler_headers(), status="*")
    assert response.status_int == 500  # never 503: Scheduler would retry it outside retryCount
    assert response.json["error"] == "InternalError"
    assert job_targets.EFFECTS == []


# -- a key shared by two jobs ------------------------------------------------------


@pytest.mark.parametrize("first_status", ["completed", "failed", "in_progress", "lease_over"])
def test_a_delivery_whose_key_names_another_jobs_run_is_refused_and_logged(
    client, ndb_client, clock, caplog, first_status
):
    # Two Scheduler jobs with one id (other projects, no scope) target two jobs of this app.
    if first_status == "failed":
        job_targets.FAILURES["flaky"] = ["permanent"]
    if first_status in ("in_progress", "lease_over"):
        job_targets.GATES["hold"] = threading.Event()
        worker = threading.Thread(target=deliver, args=(client, "slow"), kwargs={"body": b"hold"})
        worker.start()
        job_targets.STARTED.setdefault("hold", threading.Event()).wait(10)
        if first_status == "lease_over":
            clock.advance(61)
    else:
        deliver(client, "flaky")
    before = len(job_targets.EFFECTS)
    with caplog.at_level("ERROR"):
        response = deliver(client, "invoice", status=422)
    recorded = "flaky" if first_status in ("completed", "failed") else "slow"
    assert response.json["error"] == "JobMismatch"
    assert response.json["job_id"] == "invoice" and response.json["recorded_job_id"] == recorded
    message = response.json["message"]
    assert f"'{recorded}'" in message and "'invoice'" in message and "scope" in message and "job id" in message
    assert "Idempotent-Replayed" not in response.headers
    assert [r for r in caplog.records if r.levelname == "ERROR" and "invoice" in r.getMessage()]
    assert len(job_targets.EFFECTS) == before  # invoice never ran
    if first_status in ("in_progress", "lease_over"):
        job_targets.GATES["hold"].set()
        worker.join()
    with ndb_client.context():
        from models import RunRecord

        (record,) = RunRecord.query().fetch()
    assert record.job_id == recorded  # never taken over by the other job


def test_the_same_scheduler_job_id_in_two_scopes_runs_both_jobs(client):
    first = client.post(
        "/jobs/flaky?project=alpha-project&location=us-central1", headers=scheduler_headers(), status=200
    )
    second = client.post(
        "/jobs/invoice?project=beta-project&location=us-central1", headers=scheduler_headers(), status=200
    )
    assert first.json["run_id"] != second.json["run_id"]
