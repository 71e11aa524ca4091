"""Section 5: bad input gets a clear JSON error; nothing is written and nothing runs."""

from __future__ import annotations

import pytest

from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, T0, scheduler_headers


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def stored_records(ndb_client):
    with ndb_client.context():
        return RunRecord.query().fetch()


def assert_nothing_happened(ndb_client):
    assert job_targets.EFFECTS == []
    assert stored_records(ndb_client) == []


@pytest.mark.sample(8)
@pytest.mark.parametrize(
    "headers, field, words",
    [
        ({"X-CloudScheduler-ScheduleTime": T0}, "X-CloudScheduler-JobName", "missing"),
        ({"X-CloudScheduler-JobName": "", "X-CloudScheduler-ScheduleTime": T0}, "X-CloudScheduler-JobName", "missing"),
        (scheduler_headers(schedule_time=None), "X-CloudScheduler-ScheduleTime", "unix-cron"),
        (scheduler_headers(schedule_time="yesterday"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        (scheduler_headers(schedule_time="2025-10-17T23:50:00"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        (scheduler_headers(schedule_time="2025-10-17"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        (scheduler_headers(schedule_time="2025-13-17T23:50:00Z"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        (
            scheduler_headers(schedule_time="2025-10-17T23:50:00Z" + "0" * 2000),
            "X-CloudScheduler-ScheduleTime",
            "longer",
        ),
        (scheduler_headers(schedule_time="0001-01-01T00:00:00+01:00"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        (scheduler_headers(schedule_time="9999-12-31T23:59:59-01:00"), "X-CloudScheduler-ScheduleTime", "RFC 3339"),
        # Parseable, but no schedule Cloud Scheduler runs: outside the accepted range.
        (scheduler_headers(schedule_time="0001-01-01T00:00:00Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="0999-12-31T23:59:59Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="1970-01-01T00:00:00Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="1999-12-31T23:59:59.999999Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="2000-01-01T00:30:00+01:00"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="2100-01-01T00:00:00Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="2099-12-31T23:30:00-01:00"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(schedule_time="9999-12-31T23:59:59Z"), "X-CloudScheduler-ScheduleTime", "outside"),
        (scheduler_headers(scheduler_job_name="nightly invoice"), "X-CloudScheduler-JobName", "job id"),
        (scheduler_headers(scheduler_job_name="a/b"), "X-CloudScheduler-JobName", "job id"),
        (scheduler_headers(scheduler_job_name="x" * 501), "X-CloudScheduler-JobName", "job id"),
        (scheduler_headers(scheduler_job_name="x" * 1500), "X-CloudScheduler-JobName", "longer"),
        (scheduler_headers(scheduler_job_name="bad\x01name"), "X-CloudScheduler-JobName", "control"),
        (scheduler_headers(scheduler_job_name="café"), "X-CloudScheduler-JobName", "non-ASCII"),
        (
            scheduler_headers(scheduler_job_name="projects/Bad_Project/locations/us-central1/jobs/j"),
            "X-CloudScheduler-JobName",
            "project",
        ),
        (scheduler_headers(**{"X-Scheduler-Project": "no"}), "header X-Scheduler-Project", "project"),
        (scheduler_headers(**{"X-Scheduler-Location": "US Central"}), "header X-Scheduler-Location", "location"),
    ],
)
def test_bad_headers_are_400_and_change_nothing(client, ndb_client, headers, field, words):
    response = client.post("/jobs/invoice", headers=headers, status=400)
    assert response.json["error"] == "InvalidRequest"
    assert response.json["field"] == field
    assert words in response.json["message"]
    assert_nothing_happened(ndb_client)


@pytest.mark.parametrize(
    "schedule_time, spelled",
    [
        ("2000-01-01T00:00:00Z", "2000-01-01T00:00:00.000000Z"),
        ("2000-01-01T01:00:00+01:00", "2000-01-01T00:00:00.000000Z"),
        ("2099-12-31T23:59:59.999999Z", "2099-12-31T23:59:59.999999Z"),
    ],
)
def test_the_ends_of_the_schedule_time_range_are_accepted(client, schedule_time, spelled):
    response = client.post("/jobs/invoice", headers=scheduler_headers(schedule_time=schedule_time), status=200)
    assert response.json["schedule_time"] == spelled


@pytest.mark.parametrize("year", [1, 9, 99, 999, 1000, 2026, 9999])
def test_every_timestamp_is_spelled_with_a_four_digit_year(year):
    import datetime

    from dedup.keys import format_utc

    spelled = format_utc(datetime.datetime(year, 6, 1, 12, 0, tzinfo=datetime.UTC))
    assert spelled == f"{year:04d}-06-01T12:00:00.000000Z"
    import ciso8601

    assert ciso8601.parse_rfc3339(spelled).year == year  # RFC 3339 again


def test_control_characters_in_header_values_are_400(client, ndb_client):
    # A raw tab survives HTTP parsing; it must not reach the key.
    response = client.post("/jobs/invoice", headers=scheduler_headers(scheduler_job_name="job\tname"), status=400)
    assert "control" in response.json["message"]
    assert_nothing_happened(ndb_client)


def test_scope_given_twice_with_different_values_is_400(client, ndb_client):
    response = client.post(
        "/jobs/invoice?project=alpha-project",
        headers=scheduler_headers(**{"X-Scheduler-Project": "beta-project"}),
        status=400,
    )
    assert "alpha-project" in response.json["message"] and "beta-project" in response.json["message"]
    response = client.post(
        "/jobs/invoice?location=us-central1",
        headers=scheduler_headers(scheduler_job_name="projects/alpha-project/locations/europe-west1/jobs/j"),
        status=400,
    )
    assert "location" in response.json["message"]
    client.post("/jobs/invoice?project=alpha-project&project=beta-project", headers=scheduler_headers(), status=400)
    assert_nothing_happened(ndb_client)


def test_unknown_job_is_404(client, ndb_client):
    response = client.post("/jobs/nope", headers=scheduler_headers(), status=404)
    assert response.json["error"] == "NotFound"
    assert "nope" in response.json["message"]
    assert_nothing_happened(ndb_client)


def test_unknown_path_is_json_404(client):
    response = client.get("/no/such/page", status=404)
    assert response.content_type == "application/problem+json"


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
def test_other_methods_are_405_and_never_run_the_job(client, ndb_client, method):
    response = client.request("/jobs/invoice", method=method, headers=scheduler_headers(), status=405)
    assert response.headers["Allow"] == "GET, POST"
    if method != "HEAD":
        assert response.json["error"] == "MethodNotAllowed"
    assert_nothing_happened(ndb_client)


def test_oversized_body_is_refused_unread(client, ndb_client):
    response = client.post("/jobs/invoice", b"x" * (1024 * 1024 + 1), headers=scheduler_headers(), status=413)
    assert response.json["error"] == "RequestEntityTooLarge"
    assert_nothing_happened(ndb_client)


@pytest.mark.sample(3)
@pytest.mark.parametrize("name", ["x" * 1025, "", "with space", "tab\there", "new\nline", "café", "\u202e", 5, None])
def test_a_downstream_name_that_is_no_identifier_fails_the_run_for_good(make_client, ndb_client, name):
    import json

    client = make_client(
        JOBS
        + """
  named:
    kind: python
    target: tests.job_targets:downstream_named
"""
    )
    response = client.post("/jobs/named", json.dumps({"name": name}), headers=scheduler_headers(), status=422)
    assert response.json["status"] == "failed"
    assert "1 to 1024 printable ASCII characters" in response.json["error"]["message"]
    (record,) = stored_records(ndb_client)
    assert record.downstream is None and job_targets.EFFECTS == []
    ok = client.post(
        "/jobs/named",
        json.dumps({"name": "x" * 1024}),
        headers=scheduler_headers(scheduler_job_name="other"),
        status=200,
    )
    assert ok.json["downstream"] == "x" * 1024
