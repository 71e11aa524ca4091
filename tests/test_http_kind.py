"""The ``http`` kind: the run's key goes downstream; answers map to outcomes."""

from __future__ import annotations

import json

import pytest

from dedup.keys import ScheduledRunKey, parse_schedule_time
from tests.support.deliveries import scheduler_headers
from tests.support.downstream import Downstream, Reply


@pytest.fixture
def downstream():
    with Downstream() as server:
        yield server


@pytest.fixture
def client(make_client, downstream):
    return make_client(f"""
        jobs:
          sync:
            kind: http
            url: {downstream.url}/hooks/sync?src=scheduler
            timeout_seconds: 1
            lease_seconds: 30
            headers:
              X-Sync-Mode: incremental
          ping:
            kind: http
            method: GET
            url: {downstream.url}/ping
            timeout_seconds: 5
            lease_seconds: 30
    """)


def deliver(client, job="sync", status="*", body=b'{"since": "yesterday"}', **headers):
    return client.post(
        f"/jobs/{job}?project=alpha-project&location=us-central1",
        body,
        headers=scheduler_headers(**headers),
        status=status,
    )


def test_the_run_key_schedule_time_and_attempt_go_downstream(client, downstream):
    response = deliver(client, status=200)
    expected_key = ScheduledRunKey(
        "alpha-project", "us-central1", "nightly-invoice", parse_schedule_time("2025-10-17T23:50:00Z")
    ).run_id
    assert response.json["run_id"] == expected_key
    [sent] = downstream.requests
    assert (sent.method, sent.path) == ("POST", "/hooks/sync?src=scheduler")
    assert sent.headers["Idempotency-Key"] == expected_key
    assert sent.headers["X-Dedup-Schedule-Time"] == "2025-10-17T23:50:00.000000Z"
    assert sent.headers["X-Dedup-Attempt"] == "1"
    assert sent.headers["X-Sync-Mode"] == "incremental"
    assert sent.headers["Content-Type"] == "application/json"
    body = sent.json()
    assert body["idempotency_key"] == expected_key
    assert body["schedule_time"] == "2025-10-17T23:50:00.000000Z"
    assert body["attempt"] == 1
    assert body["attempt_id"] == sent.headers["X-Dedup-Attempt-Id"]
    assert (body["project"], body["location"], body["job_id"]) == ("alpha-project", "us-central1", "sync")
    assert json.loads(body["body"]) == {"since": "yesterday"}
    assert response.json["result"] == {"status": 200, "body": '{"ok": true}', "truncated": False}


def test_non_utf8_bodies_travel_as_base64(client, downstream):
    deliver(client, body=b"\xff\xfe", status=200)
    assert downstream.requests[0].json()["body_base64"] == "//4="


def test_get_jobs_send_the_key_in_headers_without_a_body(client, downstream):
    deliver(client, job="ping", status=200)
    [sent] = downstream.requests
    assert sent.method == "GET" and sent.body == b""
    assert sent.headers["Idempotency-Key"]


def test_duplicates_never_reach_the_downstream_again(client, downstream):
    deliver(client, status=200)
    deliver(client, status=200)
    deliver(client, schedule_time="2025-10-17T16:50:00-07:00", status=200)
    assert len(downstream.requests) == 1


def test_only_4_kib_of_the_body_is_stored(client, downstream):
    downstream.default = Reply(201, b"a" * 10000)
    result = deliver(client, status=200).json["result"]
    assert result["status"] == 201
    assert result["body"] == "a" * 4096
    assert result["truncated"] is True


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504])
def test_retryable_statuses_release_the_run_for_a_retry(client, downstream, status):
    downstream.script = [Reply(status, b"busy")]
    failed = deliver(client, status=500)
    assert failed.json["error"] == "RetryableFailure"
    assert failed.json["cause"]["details"]["status"] == status
    retried = deliver(client, status=200)
    assert retried.json["duplicate"] is False
    assert len(downstream.requests) == 2
    assert downstream.keys()[0] == downstream.keys()[1]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422, 301, 302])
def test_other_answers_are_permanent_failures_replayed(client, downstream, status):
    downstream.script = [Reply(status, b'{"error": "no such account"}', headers={"Location": "/elsewhere"})]
    failed = deliver(client, status=422)
    assert failed.json["status"] == "failed"
    assert failed.json["error"]["details"]["status"] == status
    assert failed.json["error"]["details"]["body"] == '{"error": "no such account"}'
    again = deliver(client, status=422)
    assert again.json["duplicate"] is True
    assert len(downstream.requests) == 1  # redirects are not followed either


@pytest.mark.slow
def test_a_timeout_is_retryable(client, downstream):
    downstream.script = [Reply(200, delay=2.5)]
    failed = deliver(client, status=500)
    assert "timed out" in failed.json["message"]
    assert deliver(client, status=200).json["attempt"] == 2  # the released record's retry


@pytest.mark.slow
def test_a_trickling_body_cannot_outlive_the_timeout(client, downstream):
    # Each byte arrives well within the read timeout; the whole body would not.
    downstream.script = [Reply(200, b"x" * 40, trickle=0.1)]
    failed = deliver(client, status=500)
    assert "longer than 1s" in failed.json["message"]


def test_a_refused_connection_is_retryable(make_client):
    client = make_client("""
        jobs:
          sync:
            kind: http
            url: http://127.0.0.1:9/nothing-listens-here
            timeout_seconds: 2
            lease_seconds: 30
    """)
    failed = deliver(client, status=500)
    assert failed.json["error"] == "RetryableFailure"
    assert "failed" in failed.json["message"]


def test_get_jobs_carry_manual_run_parameters_in_the_query(client, downstream):
    client.post_json("/api/v1/jobs/ping/runs", {"parameters": {"since": "2026-11-28", "limit": 5}}, status=201)
    [sent] = downstream.requests
    assert sent.path == "/ping?since=2026-11-28&limit=5"


def test_a_job_written_against_the_old_name_of_the_downstream_key_still_runs():
    """RunContext.idempotency_key is downstream_key's first name: kept, with a DeprecationWarning."""
    import warnings

    from jobs.base import RunContext

    context = RunContext(
        run_id="r" * 64, attempt_id="a", attempt=1, job_id="j", scheduler_job_name=None, schedule_time=None
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert context.idempotency_key == context.downstream_key == "r" * 64
    assert [w.category for w in caught] == [DeprecationWarning] and "downstream_key" in str(caught[0].message)
