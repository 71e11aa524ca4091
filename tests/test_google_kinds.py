"""Workflows, Cloud Run jobs and Cloud Build triggers: one downstream execution per run.

Against local fakes of the APIs and of the metadata server (see
devtools/google_fakes.py); credentials come through google-auth's
Application Default Credentials as on App Engine.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from dedup.keys import ScheduledRunKey, parse_schedule_time
from dedup.ledger import RunDescription
from dedup.runner import RunningAttempt
from dedup.steps import StepDecision, StepState
from devtools.google_fakes import SERVICE_ACCOUNT, TOKEN
from jobs.base import RunContext
from jobs.kinds.google_api import DOUBT_SETTLE_SECONDS
from models import RunRecord
from tests.support.deliveries import T0, scheduler_headers

WORKFLOW = "projects/acme-prod/locations/us-central1/workflows/nightly-etl"
RUN_JOB = "projects/acme-prod/locations/us-central1/jobs/reindex"
TRIGGER = "projects/acme-prod/locations/global/triggers/release"


def jobs_yaml(base: str) -> str:
    return f"""
        jobs:
          etl:
            kind: workflow
            workflow: {WORKFLOW}
            argument: {{tables: [orders, refunds]}}
            api_base: {base}
            timeout_seconds: 2
            lease_seconds: 30
          reindex:
            kind: cloud_run_job
            job: {RUN_JOB}
            args: [--full]
            env: {{MODE: nightly}}
            api_base: {base}
            timeout_seconds: 2
            lease_seconds: 30
          release:
            kind: cloud_build_trigger
            trigger: {TRIGGER}
            branch: main
            substitutions: {{_ENV: prod}}
            api_base: {base}
            timeout_seconds: 2
            lease_seconds: 30
    """


@pytest.fixture
def client(make_client, google):
    return make_client(jobs_yaml(google.url))


def deliver(client, job, status="*", schedule_time=T0):
    return client.post(
        f"/jobs/{job}?project=acme-prod&location=us-central1",
        headers=scheduler_headers(scheduler_job_name=f"{job}-schedule", schedule_time=schedule_time),
        status=status,
    )


def run_id_for(job) -> str:
    return ScheduledRunKey("acme-prod", "us-central1", f"{job}-schedule", parse_schedule_time(T0)).run_id


def test_workflow_execution_carries_the_key_in_argument_and_label(client, google):
    response = deliver(client, "etl", status=200)
    [create] = google.api_calls("POST")
    assert create.path == f"/v1/{WORKFLOW}/executions"
    assert create.headers["Authorization"] == f"Bearer {TOKEN}"  # ADC from the metadata server
    argument = json.loads(create.body["argument"])
    assert argument == {
        "tables": ["orders", "refunds"],
        "idempotency_key": run_id_for("etl"),
        "schedule_time": "2025-10-17T23:50:00.000000Z",
    }
    label = create.body["labels"]["idempotency_key"]
    assert label == run_id_for("etl")[:63] and len(label) <= 63
    name = google.executions[0]["name"]
    assert response.json["downstream"] == name
    assert response.json["result"] == {"execution": name, "state": "ACTIVE", "adopted": False}


def test_cloud_run_job_gets_the_key_in_container_env(client, google):
    response = deliver(client, "reindex", status=200)
    [run] = google.api_calls("POST")
    assert run.path == f"/v2/{RUN_JOB}:run"
    [override] = run.body["overrides"]["containerOverrides"]
    env = {item["name"]: item["value"] for item in override["env"]}
    assert env == {
        "MODE": "nightly",
        "IDEMPOTENCY_KEY": run_id_for("reindex"),
        "SCHEDULE_TIME": "2025-10-17T23:50:00.000000Z",
        "RUN_ATTEMPT": "1",
    }
    assert override["args"] == ["--full"]
    execution = google.run_operations[0]["metadata"]["name"]
    assert response.json["downstream"] == execution == google.run_executions[0]["name"]
    assert response.json["result"]["operation"] == google.run_operations[0]["name"]
    assert google.api_calls("GET") == []  # a first attempt lists nothing: nothing can exist yet


def test_cloud_build_trigger_gets_the_key_in_substitutions(client, google):
    response = deliver(client, "release", status=200)
    [run] = google.api_calls("POST")
    assert run.path == f"/v1/{TRIGGER}:run"
    assert run.body["projectId"] == "acme-prod" and run.body["triggerId"] == "release"
    assert run.body["source"]["branchName"] == "main"
    assert run.body["source"]["substitutions"] == {
        "_ENV": "prod",
        "_IDEMPOTENCY_KEY": run_id_for("release"),
        "_SCHEDULE_TIME": "2025-10-17T23:50:00.000000Z",
    }
    assert response.json["downstream"] == google.builds[0]["name"]


@pytest.mark.parametrize("job, created", [("etl", "executions"), ("reindex", "run_operations"), ("release", "builds")])
def test_five_deliveries_concurrent_and_after_completion_start_one_execution(client, google, job, created):
    google.fail(":run" if job != "etl" else "/executions", status=200, delay=0.5, times=1)  # a slow first answer
    results = []
    threads = [threading.Thread(target=lambda: results.append(deliver(client, job))) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(r.status_int for r in results).count(500) == 0
    assert any(r.status_int == 200 and not r.json["duplicate"] for r in results)
    for _ in range(5):
        assert deliver(client, job, status=200).json["duplicate"] is True
    assert len(getattr(google, created)) == 1
    assert len(google.api_calls("POST")) == 1


def test_a_takeover_adopts_the_recorded_execution(client, google, clock, ndb_client):
    # Attempt 1 started a Cloud Run execution and recorded it, then its instance died.
    state = client.app.extensions["dedup"]
    job = state.jobs["reindex"]
    with ndb_client.context():
        claim = state.ledger.claim_run(run_id_for("reindex"), RunDescription("scheduler", "reindex"), job.policy)
        first = dataclasses.replace(claim.attempt, held=RunningAttempt(state.ledger, claim.attempt))
        job.runner.run(RunContext.for_attempt(first, "reindex", schedule_time=parse_schedule_time(T0)))
    assert len(google.run_operations) == 1
    clock.advance(31)  # the lease is over
    takeover = deliver(client, "reindex", status=200)
    assert takeover.json["attempt"] == 2
    assert takeover.json["result"]["adopted"] is True
    assert takeover.json["result"]["execution"] == google.run_operations[0]["metadata"]["name"]
    assert len(google.run_operations) == 1


# How a create's answer gets lost: the API starts the execution, then answers 503, or
# answers after the client's 2 s timeout.
CREATED_THEN_503 = pytest.param({"status": 503, "after_effect": True}, id="created-then-503")
CREATED_THEN_TIMEOUT = pytest.param({"status": 200, "delay": 3}, id="created-then-timeout", marks=pytest.mark.slow)


KINDS_THAT_CREATE = pytest.mark.parametrize(
    "job, path_part, list_part, created",
    [("etl", "/executions", "/executions", "executions"), ("release", ":run", "/builds", "builds")],
)


@KINDS_THAT_CREATE
@pytest.mark.parametrize("lost", [CREATED_THEN_503, CREATED_THEN_TIMEOUT])
def test_a_lost_answer_is_found_at_once_and_adopted(client, google, job, path_part, list_part, created, lost):
    # The API starts the execution but its answer is lost: the attempt looks for it by its
    # label / substitution at once and adopts it instead of releasing the run.
    google.fail(path_part, **lost)
    adopted = deliver(client, job, status=200)
    assert adopted.json["attempt"] == 1 and adopted.json["result"]["adopted"] is True
    assert len(getattr(google, created)) == 1 and len(google.api_calls("POST")) == 1
    assert adopted.json["downstream"] == getattr(google, created)[0]["name"]


@KINDS_THAT_CREATE
@pytest.mark.parametrize("lost", [CREATED_THEN_503, CREATED_THEN_TIMEOUT])
@pytest.mark.parametrize("retry_after_seconds", [0, 2 * 3600])
def test_a_lost_answer_whose_search_failed_is_found_by_the_retry(
    client, google, clock, job, path_part, list_part, created, lost, retry_after_seconds
):
    # The answer is lost and the search after it fails too: the run is released, with the create
    # recorded as in doubt, and the retry finds the execution instead of starting another,
    # however late it comes (the release forgot the run, not the execution).
    google.fail(path_part, **lost)
    google.fail(list_part, method="GET", spare=1)  # the search before the create works; the one after fails
    released = deliver(client, job, status=500)
    assert "create call in doubt, and the search for what it started failed" in released.json["message"]
    assert len(getattr(google, created)) == 1
    clock.advance(retry_after_seconds)
    retried = deliver(client, job, status=200)
    assert retried.json["result"]["adopted"] is True
    assert len(getattr(google, created)) == 1
    assert len(google.api_calls("POST")) == 1
    assert retried.json["downstream"] == getattr(google, created)[0]["name"]


@KINDS_THAT_CREATE
def test_a_create_refused_before_it_acted_is_recorded_as_not_taken(client, google, job, path_part, list_part, created):
    # A 4xx refuses the create: nothing started, so its step is recorded as not taken (rerun), and
    # the run that reopens it creates at once, neither asking anyone nor waiting out a doubt.
    google.fail(path_part, status=400, api_status="INVALID_ARGUMENT", message="bad")
    failed = deliver(client, job, status=422)
    record = client.get(f"/api/v1/runs/{failed.json['run_id']}").json
    assert [(s["name"], s["state"]) for s in record["steps"]] == [("create", "rerun")]
    assert getattr(google, created) == []


@pytest.mark.parametrize(
    "status, api_status",
    [(429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"), (503, "UNAVAILABLE"), (504, "DEADLINE_EXCEEDED")],
)
def test_retryable_api_errors_release_the_run(client, google, clock, status, api_status):
    google.fail(":run", status=status, api_status=api_status, message="try later")
    failed = deliver(client, "reindex", status=500)
    assert failed.json["cause"]["details"] == {"http_status": status, "status": api_status, "message": "try later"}
    assert failed.json["cause"]["type"] == "CreateInDoubt"  # a 5xx after sending may have started it
    again = deliver(client, "reindex", status=500)  # searched again; nothing is created on a guess
    assert again.json["attempt"] == 2 and len(run_calls(google)) == 1


@pytest.mark.parametrize(
    "status, api_status",
    [(400, "INVALID_ARGUMENT"), (403, "PERMISSION_DENIED"), (404, "NOT_FOUND"), (400, "FAILED_PRECONDITION")],
)
def test_permanent_api_errors_keep_the_apis_message(client, google, status, api_status):
    message = f"Permission 'run.jobs.runWithOverrides' denied ({api_status})"
    google.fail(":run", status=status, api_status=api_status, message=message)
    failed = deliver(client, "reindex", status=422)
    assert message in failed.json["error"]["message"]
    assert failed.json["error"]["details"]["status"] == api_status
    assert deliver(client, "reindex", status=422).json["duplicate"] is True
    assert len(google.api_calls("POST")) == 1


def test_an_unreachable_api_is_retryable(make_client, google):
    from devtools.emulator import free_port

    client = make_client(jobs_yaml(f"http://127.0.0.1:{free_port()}"))
    assert "failed" in deliver(client, "etl", status=500).json["message"]


@pytest.mark.parametrize("job", ["etl", "reindex", "release"])
def test_manual_runs_merge_parameters(client, google, job):
    parameters = {
        "etl": {"tables": ["refunds"], "dry_run": True},
        "reindex": {"SHARD": 3, "args": ["--shard", "3"]},
        "release": {"_VERSION": "1.2.3"},
    }[job]
    first = client.post_json(
        f"/api/v1/jobs/{job}/runs", {"clientToken": "manual-1", "parameters": parameters}, status=201
    )
    again = client.post_json(
        f"/api/v1/jobs/{job}/runs", {"clientToken": "manual-1", "parameters": parameters}, status=200
    )
    assert again.json == {**first.json, "duplicate": True}  # the same run, answered again
    [call] = google.api_calls("POST")
    key = first.json["run_id"]
    if job == "etl":
        argument = json.loads(call.body["argument"])
        assert argument == {"tables": ["refunds"], "dry_run": True, "idempotency_key": key, "schedule_time": None}
    elif job == "reindex":
        [override] = call.body["overrides"]["containerOverrides"]
        env = {item["name"]: item["value"] for item in override["env"]}
        assert env == {
            "MODE": "nightly",
            "SHARD": "3",
            "IDEMPOTENCY_KEY": key,
            "SCHEDULE_TIME": "",
            "RUN_ATTEMPT": "1",
        }
        assert override["args"] == ["--shard", "3"]
    else:
        assert call.body["source"]["substitutions"] == {
            "_ENV": "prod",
            "_VERSION": "1.2.3",
            "_IDEMPOTENCY_KEY": key,
            "_SCHEDULE_TIME": "",
        }


@pytest.mark.parametrize(
    "job, parameters, words",
    [
        ("reindex", {"bad-name": "x"}, "not a valid environment variable name"),
        ("reindex", {"IDEMPOTENCY_KEY": "mine"}, "set by the app"),
        ("reindex", {"RUN_ATTEMPT": "7"}, "set by the app"),
        ("release", {"VERSION": "1"}, "not a user substitution"),
        ("release", {"_N": 1}, "must be a string"),
    ],
)
def test_bad_manual_parameters_are_permanent_and_call_nothing(client, google, job, parameters, words):
    response = client.post_json(f"/api/v1/jobs/{job}/runs", {"parameters": parameters}, status=422)
    assert words in response.json["error"]["message"]
    assert google.api_calls() == []


def test_the_metadata_server_supplied_the_credentials(client, google):
    deliver(client, "etl", status=200)
    token_calls = [c for c in google.calls if c.path.endswith("/token")]
    assert all(c.headers.get("Metadata-Flavor") == "Google" for c in token_calls)
    assert SERVICE_ACCOUNT.endswith(".iam.gserviceaccount.com")


@pytest.mark.slow
@pytest.mark.parametrize(
    "job, path_part, created, named",
    [("etl", "/executions", "executions", "execution"), ("release", ":run", "builds", "build")],
)
def test_a_takeover_finds_an_unrecorded_execution_by_its_label(client, google, clock, job, path_part, created, named):
    # Attempt 1's create succeeds downstream but its answer is slow; the lease runs out
    # meanwhile and attempt 2 takes over before anything was recorded but the create's start.
    google.fail(path_part, status=200, delay=1.5)
    results = []
    first = threading.Thread(target=lambda: results.append(deliver(client, job)))
    first.start()
    for _ in range(100):
        if getattr(google, created):
            break
        threading.Event().wait(0.02)
    clock.advance(31)
    takeover = deliver(client, job, status=200)
    first.join(10)
    assert takeover.json["attempt"] == 2
    assert takeover.json["result"] == {named: getattr(google, created)[0]["name"], "adopted": True}
    assert results[0].status_int == 409 and results[0].json["error"] == "StaleAttempt"
    assert len(getattr(google, created)) == 1 and len(google.api_calls("POST")) == 1


def test_a_reused_expired_token_does_not_adopt_the_old_requests_execution(client, google, clock):
    client.post_json("/api/v1/jobs/etl/runs", {"clientToken": "t1", "parameters": {"tables": ["a"]}}, status=201)
    clock.advance(2 * 3600)  # past finished + 1 h: the token is free again
    second = client.post_json(
        "/api/v1/jobs/etl/runs", {"clientToken": "t1", "parameters": {"tables": ["z"]}}, status=201
    )
    assert second.json["result"]["adopted"] is False
    assert len(google.executions) == 2


def run_calls(google):
    return [c for c in google.api_calls("POST") if c.path == f"/v2/{RUN_JOB}:run"]


def list_calls(google):
    return [c for c in google.api_calls("GET") if c.path == f"/v2/{RUN_JOB}/executions"]


def reindex_env(**changes) -> dict[str, str]:
    """What the reindex job's scheduled run at T0 sends (but RUN_ATTEMPT), with ``changes``."""
    env = {"MODE": "nightly", "IDEMPOTENCY_KEY": run_id_for("reindex"), "SCHEDULE_TIME": "2025-10-17T23:50:00.000000Z"}
    return {**env, **changes}


def put_run_execution(google, name: str, created: str, env: dict[str, str]) -> dict:
    """An execution of the reindex job that something else started (Cloud Run keeps it as jobs.run did)."""
    execution = {
        "name": f"{RUN_JOB}/executions/{name}",
        "createTime": created,
        "labels": {},
        "template": {"containers": [{"name": "job", "env": [{"name": k, "value": v} for k, v in env.items()]}]},
    }
    google.run_executions.append(execution)
    return execution


@pytest.mark.parametrize("lost", [CREATED_THEN_503, CREATED_THEN_TIMEOUT])
@pytest.mark.parametrize("search_fails, retry_after_seconds", [(False, 0), (True, 0), (True, 2 * 3600)])
def test_a_lost_cloud_run_answer_is_found_by_its_env_and_adopted(
    client, google, clock, lost, search_fails, retry_after_seconds
):
    # jobs.run starts the execution but its answer is lost.  The attempt lists the job's
    # executions at once and adopts the one carrying its env; if that list fails too, the
    # run is released and the next attempt (however late) lists first and adopts it.
    google.fail(":run", **lost)
    if search_fails:
        google.fail(f"{RUN_JOB}/executions", method="GET")
        released = deliver(client, "reindex", status=500)
        assert released.json["attempt"] == 1
        assert "create call in doubt, and the search for what it started failed" in released.json["message"]
        clock.advance(retry_after_seconds)
    adopted = deliver(client, "reindex", status=200)
    [execution] = google.run_executions
    assert len(run_calls(google)) == 1
    assert adopted.json["attempt"] == (2 if search_fails else 1)
    assert adopted.json["result"] == {"execution": execution["name"], "adopted": True}
    assert adopted.json["downstream"] == execution["name"]
    assert len(list_calls(google)) == (2 if search_fails else 1)
    assert deliver(client, "reindex", status=200).json["duplicate"] is True
    assert len(run_calls(google)) == 1 and len(google.run_executions) == 1


def test_a_cloud_run_refusal_is_searched_then_a_person_decides_and_a_rerun_creates_once(
    client, google, clock, ndb_client
):
    # A 503 that started nothing: in doubt all the same, so the attempt searches, finds
    # nothing and releases the run; retries search again; a minute on, still nothing listed,
    # the run stops for a person, who runs the create again: one execution.
    google.fail(":run", status=503)
    failed = deliver(client, "reindex", status=500)
    assert "create call in doubt, nothing found; recorded and retried" in failed.json["message"]
    assert google.run_executions == [] and len(list_calls(google)) == 1
    # Retried at once: still in doubt (what it started may not be listed yet), so it searches
    # again and creates nothing; the doubt is in the run's record, not assumed away.
    early = deliver(client, "reindex", status=500)
    assert early.json["attempt"] == 2 and "in doubt since" in early.json["message"]
    assert len(run_calls(google)) == 1 and len(list_calls(google)) == 2
    record = client.get(f"/api/v1/runs/{early.json['run_id']}").json
    assert [(s["name"], s["state"], s["attempt"]) for s in record["steps"]] == [("create", "started", 1)]
    clock.advance(DOUBT_SETTLE_SECONDS)
    asked = deliver(client, "reindex", status=422)  # nothing listed a minute on: never assumed
    assert asked.json["attempt"] == 3 and asked.json["error"]["type"] == "NeedsReview"
    assert asked.json["error"]["details"] == {"step": "create", "attempt": 1, "key": f"{asked.json['run_id']}:create"}
    assert len(run_calls(google)) == 1 and google.run_executions == []
    retried = settle_and_reopen(client, ndb_client, "reindex", StepState.RERUN)
    assert retried.record.status == "completed" and retried.record.result["adopted"] is False
    [execution] = google.run_executions
    assert retried.record.downstream == execution["name"]
    assert len(run_calls(google)) == 2
    [override] = run_calls(google)[-1].body["overrides"]["containerOverrides"]
    assert {e["name"]: e["value"] for e in override["env"]}["RUN_ATTEMPT"] == "4"


def test_a_create_a_person_marks_done_is_not_made_again(client, google, clock, ndb_client):
    google.fail(":run", status=503)
    deliver(client, "reindex", status=500)
    clock.advance(DOUBT_SETTLE_SECONDS)
    deliver(client, "reindex", status=422)
    found = f"{RUN_JOB}/executions/found-by-hand"
    done = settle_and_reopen(client, ndb_client, "reindex", StepState.DONE, {"name": found})
    assert done.record.status == "completed" and done.record.result == {"execution": found, "adopted": True}
    assert len(run_calls(google)) == 1


def settle_and_reopen(client, ndb_client, job: str, decision, result=None):
    """An operator's decision on the run's create step, then its reopen at the attempt seen (what
    the run page's form does for a declared slot: service.steps.settle_step)."""
    from service.principal import Principal
    from service.runs import run_scheduled

    state = client.app.extensions["dedup"]
    run_id = run_id_for(job)
    key = ScheduledRunKey("acme-prod", "us-central1", f"{job}-schedule", parse_schedule_time(T0))
    with ndb_client.context():
        seen = state.ledger.lookup(run_id).attempt
        settled = state.ledger.settle_step(run_id, StepDecision("create", decision, seen, "user:ops@x.test", result))
        assert not isinstance(settled, str), settled
        return run_scheduled(state, Principal("user:ops@x.test"), job, state.jobs[job], key, b"", reopen_attempt=seen)


@pytest.mark.slow
def test_a_takeover_finds_an_unrecorded_cloud_run_execution_by_its_env(client, google, clock):
    # Attempt 1's jobs.run starts the execution but answers slowly; the lease runs out
    # meanwhile and attempt 2 takes over before anything was recorded.
    google.fail(":run", status=200, delay=1.5)
    results = []
    first = threading.Thread(target=lambda: results.append(deliver(client, "reindex")))
    first.start()
    for _ in range(100):
        if google.run_executions:
            break
        threading.Event().wait(0.02)
    clock.advance(31)
    takeover = deliver(client, "reindex", status=200)
    first.join(10)
    assert takeover.json["attempt"] == 2
    assert takeover.json["result"] == {"execution": google.run_executions[0]["name"], "adopted": True}
    assert results[0].status_int == 409 and results[0].json["error"] == "StaleAttempt"
    assert len(google.run_executions) == 1 and len(run_calls(google)) == 1


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"IDEMPOTENCY_KEY": "f" * 64}, id="another-runs-key"),
        pytest.param({"MODE": "weekly"}, id="same-key-other-env"),
        pytest.param({"SCHEDULE_TIME": "2025-10-16T23:50:00.000000Z"}, id="same-key-other-schedule-time"),
    ],
)
def test_an_execution_not_carrying_all_of_the_runs_env_is_not_adopted(client, google, clock, other):
    # An execution of another run, or of an earlier request under the same (expired,
    # reused) key with other parameters: neither the in-doubt search nor attempt 2's adopts it.
    put_run_execution(google, "not-ours", "2025-10-17T23:49:00Z", reindex_env(**other))
    google.fail(":run", status=503)
    deliver(client, "reindex", status=500)
    retried = deliver(client, "reindex", status=500)  # adopting it would have answered 200
    assert retried.json["attempt"] == 2 and "in doubt since" in retried.json["message"]
    assert len(list_calls(google)) == 2
    assert len(google.run_executions) == 1 and len(run_calls(google)) == 1


def test_the_search_reads_a_second_page_and_adopts_the_oldest_match(client, google, clock):
    # Attempt 1's jobs.run started an execution (its answer lost, its search failed); then
    # 60 executions of other runs came, and one more of this run (a stray second): attempt 2
    # pages through the newest first and adopts the oldest carrying its env.
    google.fail(":run", status=503, after_effect=True)
    google.fail(f"{RUN_JOB}/executions", method="GET")
    deliver(client, "reindex", status=500)
    [ours] = google.run_executions
    ours["createTime"] = "2025-10-17T23:50:01Z"
    # Later, but before ours as text ("." < "Z"): createTime must be compared as a time.
    put_run_execution(google, "stray", "2025-10-17T23:50:01.5Z", reindex_env(RUN_ATTEMPT="1"))
    for n in range(60):
        put_run_execution(google, f"other-{n}", f"2025-10-17T23:51:{n:02d}Z", reindex_env(IDEMPOTENCY_KEY=f"{n:064x}"))
    retried = deliver(client, "reindex", status=200)
    assert retried.json["result"] == {"execution": ours["name"], "adopted": True}
    assert len(run_calls(google)) == 1 and len(google.run_executions) == 62
    first, second = list_calls(google)[1:]
    assert first.query == {"pageSize": "50", "showDeleted": "true"}
    assert second.query == {"pageSize": "50", "showDeleted": "true", "pageToken": "from-50"}


def test_a_lost_answer_of_a_manual_cloud_run_run_is_found_despite_its_empty_schedule_time(client, google):
    # A manual run's SCHEDULE_TIME is empty, and Cloud Run's JSON leaves an empty value out.
    google.fail(":run", status=503, after_effect=True)
    run = client.post_json("/api/v1/jobs/reindex/runs", {"parameters": {"SHARD": 1}}, status=201)
    [execution] = google.run_executions
    assert {"name": "SCHEDULE_TIME"} in execution["template"]["containers"][0]["env"]
    assert run.json["result"] == {"execution": execution["name"], "adopted": True}


def test_a_reused_expired_token_does_not_adopt_the_old_requests_cloud_run_execution(client, google, clock):
    client.post_json("/api/v1/jobs/reindex/runs", {"clientToken": "t1", "parameters": {"SHARD": 1}}, status=201)
    clock.advance(2 * 3600)  # past finished + 1 h: the token is free again
    google.fail(":run", status=503)  # in doubt: the search must not adopt the old request's execution
    client.post_json("/api/v1/jobs/reindex/runs", {"clientToken": "t1", "parameters": {"SHARD": 2}}, status=500)
    clock.advance(DOUBT_SETTLE_SECONDS)
    second = client.post_json(
        "/api/v1/jobs/reindex/runs", {"clientToken": "t1", "parameters": {"SHARD": 2}}, status=422
    )
    assert second.json["attempt"] == 3 and second.json["error"]["type"] == "NeedsReview"  # not the old one
    # attempt 2 listed before its jobs.run and after it, attempt 3 before asking a person: none
    # adopted the old request's execution, and nothing more was created
    assert len(google.run_executions) == 1 and len(list_calls(google)) == 3


def test_cloud_run_executions_list_takes_no_filter(google):
    # As the real API: executions.list has pageSize, pageToken and showDeleted only.
    import requests

    url = f"{google.url}/v2/{RUN_JOB}/executions"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    refused = requests.get(url, params={"filter": "x"}, headers=headers, timeout=5)
    assert refused.status_code == 400 and refused.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert requests.get(url, params={"pageSize": "5", "showDeleted": "true"}, headers=headers, timeout=5).json() == {}


def test_408_is_retryable(client, google):
    google.fail(":run", status=408, api_status="", message="request timeout")
    deliver(client, "reindex", status=500)


def test_an_empty_args_parameter_clears_the_args(client, google):
    client.post_json("/api/v1/jobs/reindex/runs", {"parameters": {"args": []}}, status=201)
    [override] = google.api_calls("POST")[0].body["overrides"]["containerOverrides"]
    assert override["clearArgs"] is True and "args" not in override


def test_builds_are_found_through_documented_filters_only(client, google):
    google.fail(":run", status=503, after_effect=True)
    deliver(client, "release", status=200)  # found at once by the search after the lost answer
    lists = [c for c in google.api_calls("GET") if c.path.endswith("/builds")]
    assert lists and all(c.query["filter"] == 'trigger_id="uuid-release"' for c in lists)


def test_a_create_not_listed_yet_is_waited_for_and_never_made_twice(client, google, clock, ndb_client):
    # jobs.run starts the execution and answers 503, and the listing lags: the search after the
    # lost answer, and a retry at once, find nothing.  Neither creates: the doubt is recorded in
    # the run and searched again.  Once the listing shows it, the next retry adopts it.
    google.hide_new = True
    google.fail(":run", status=503, after_effect=True)
    first = deliver(client, "reindex", status=500)
    assert "create call in doubt, nothing found; recorded" in first.json["message"]
    with ndb_client.context():
        create = RunRecord.get_by_id(first.json["run_id"]).steps["create"]
    assert create["state"] == "started" and create["doubt"] == "create call in doubt, nothing found"
    assert create["doubt_at"] and create["attempt"] == 1
    clock.advance(DOUBT_SETTLE_SECONDS / 2)
    early = deliver(client, "reindex", status=500)
    assert "in doubt since" in early.json["message"] and len(run_calls(google)) == 1
    google.unlisted.clear()  # the listing caught up
    adopted = deliver(client, "reindex", status=200)
    assert adopted.json["attempt"] == 3 and adopted.json["result"]["adopted"] is True
    assert len(run_calls(google)) == 1 and len(google.run_executions) == 1
    record = client.get(f"/api/v1/runs/{adopted.json['run_id']}").json
    assert [(s["name"], s["state"]) for s in record["steps"]] == [("create", "done")]


def test_a_2xx_without_the_executions_name_is_in_doubt_and_searched(client, google):
    # The execution started, but the 2xx names no operation: in doubt, so it is searched for and adopted.
    google.fail(":run", status=200, after_effect=True)
    adopted = deliver(client, "reindex", status=200)
    assert adopted.json["result"] == {"execution": google.run_executions[0]["name"], "adopted": True}
    assert len(run_calls(google)) == 1 and len(list_calls(google)) == 1
