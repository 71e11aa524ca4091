"""Manual runs with client tokens (the ECS model) through the Flask app on the emulator."""

from __future__ import annotations

import datetime
import json
import threading
import uuid

import pytest

from models import RunRecord
from tests import job_targets
from tests.support.deliveries import scheduler_headers
from tests.support.manual_runs import JOBS, start, start_slow

HOUR = 3600


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


def parse_time(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_new_run_is_201_with_the_result_and_the_token(client, clock):
    response = start(client, parameters={"customer": "c-1"}, status=201)
    body = response.json
    assert body["status"] == "completed" and body["attempt"] == 1
    assert body["clientToken"] == "tok-1" and body["job_id"] == "invoice"
    assert body["result"] == {"done": True, "attempt": 1}
    assert len(body["run_id"]) == 64
    assert response.headers["Idempotency-Key"] == "tok-1"
    assert "Idempotent-Replayed" not in response.headers
    # Finished at once: min(created + 24 h, finished + 1 h) = now + 1 h.
    assert parse_time(response.headers["Idempotency-Expires"]) == clock.now() + datetime.timedelta(hours=1)
    [effect] = job_targets.EFFECTS
    assert effect["run_id"] == body["run_id"]


def test_parameters_reach_the_job(client):
    start(client, job="values", parameters={"value": {"n": 3}}, status=201)
    assert job_targets.EFFECTS[0]["parameters"] == {"value": {"n": 3}}
    assert job_targets.EFFECTS[0]["source"] == "api"
    assert job_targets.EFFECTS[0]["client_token"] == "tok-1"


def test_a_retry_with_the_same_token_replays_without_running(client):
    first = start(client, parameters={"customer": "c-1"}, status=201)
    again = start(client, parameters={"customer": "c-1"}, status=200)
    assert again.json == {**first.json, "duplicate": True}  # the same run's answer, as a duplicate
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(job_targets.EFFECTS) == 1


def test_the_token_may_come_in_the_header(client):
    first = start(client, token=None, headers={"Idempotency-Key": "tok-h"}, status=201)
    assert first.json["clientToken"] == "tok-h"
    again = start(client, token="tok-h", headers={"Idempotency-Key": "tok-h"}, status=200)
    assert again.headers["Idempotent-Replayed"] == "true"
    conflict = start(client, token="tok-x", headers={"Idempotency-Key": "tok-y"}, status=400)
    assert conflict.json["error"] == "InvalidParameterException"
    assert "differ" in conflict.json["message"]
    assert len(job_targets.EFFECTS) == 1


def test_without_a_token_the_server_makes_one_to_retry_with(client):
    first = start(client, token=None, status=201)
    token = first.json["clientToken"]
    assert uuid.UUID(token).version == 4
    assert first.headers["Idempotency-Key"] == token
    again = start(client, token=token, status=200)
    assert again.json["run_id"] == first.json["run_id"]
    start(client, token=None, status=201)  # another token-less call is another run
    assert len(job_targets.EFFECTS) == 2


@pytest.mark.parametrize(
    "token, words",
    [
        ("x" * 65, "1 to 64 characters"),
        ("", "1 to 64 characters"),
        ("has space", "character 4 is ' '"),
        ("del\x7f", "character 4 is '\\x7f'"),
        ("tab\there", "character 4 is '\\t'"),
        ("café", "character 4 is 'é'"),
    ],
)
def test_token_rules_are_enforced_and_named(client, ndb_client, token, words):
    response = start(client, token=token, status=400)
    assert response.json["error"] == "InvalidParameterException"
    assert words in response.json["message"]
    assert job_targets.EFFECTS == []
    with ndb_client.context():
        assert RunRecord.query().fetch() == []


def test_token_edges_that_are_valid(client):
    start(client, token="x" * 64, status=201)
    start(client, token="!~", status=201)
    start(client, token="TOK-1", status=201)
    start(client, token="tok-1", status=201)  # case-sensitive: another token
    assert len(job_targets.EFFECTS) == 4


@pytest.mark.parametrize(
    "body, words",
    [
        ("{not json", "not valid JSON"),
        ('["clientToken"]', "JSON object"),
        ('{"clientToken": 5}', "must be a string"),
        ('{"clientToken": "t", "parameters": [1]}', "parameters must be a JSON object"),
        ('{"clientToken": "t", "parameter": {}}', "unknown field(s) parameter"),
    ],
)
def test_malformed_bodies_are_400_and_run_nothing(client, body, words):
    response = start(client, body=body, status=400)
    assert response.json["error"] == "InvalidParameterException"
    assert words in response.json["message"]
    assert job_targets.EFFECTS == []


def test_unknown_job_is_404_and_writes_nothing(client, ndb_client):
    start(client, job="nope", status=404)
    with ndb_client.context():
        assert RunRecord.query().fetch() == []


def test_a_token_belongs_to_its_job_and_never_meets_scheduled_runs(client):
    one = start(client, job="invoice", status=201)
    two = start(client, job="refund", status=201)
    assert one.json["run_id"] != two.json["run_id"]
    scheduled = client.post("/jobs/invoice", headers=scheduler_headers(scheduler_job_name="tok-1"), status=200)
    assert scheduled.json["duplicate"] is False
    assert len(job_targets.EFFECTS) == 3


def test_same_token_other_parameters_is_a_conflict_naming_them(client):
    first = start(client, parameters={"customer": "c-1", "amount": 10, "note": "x"}, status=201)
    conflict = start(client, parameters={"customer": "c-1", "amount": 11, "memo": "y"}, status=422)
    assert conflict.json["error"] == "ConflictException"
    assert conflict.json["run_id"] == first.json["run_id"]
    assert conflict.json["differing"] == ["amount", "memo", "note"]
    assert "amount" in conflict.json["message"]
    assert len(job_targets.EFFECTS) == 1


def test_excluded_parameters_do_not_count(client):
    start(client, parameters={"customer": "c-1", "region": "eu"}, status=201)
    again = start(client, parameters={"customer": "c-1", "region": "us"}, status=200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(job_targets.EFFECTS) == 1


def test_parameter_order_does_not_matter(client):
    start(client, body='{"clientToken": "t", "parameters": {"a": 1, "b": {"x": 1, "y": 2}}}', status=201)
    start(client, body='{"parameters": {"b": {"y": 2, "x": 1}, "a": 1}, "clientToken": "t"}', status=200)
    assert len(job_targets.EFFECTS) == 1


@pytest.mark.parametrize("value", [0, {}, [], None, False, ""])
def test_falsy_results_are_stored_and_replayed_never_rerun(client, value):
    first = start(client, job="values", parameters={"value": value}, status=201)
    again = start(client, job="values", parameters={"value": value}, status=200)
    assert first.json["result"] == value and again.json["result"] == value
    assert "result" in again.json
    assert len(job_targets.EFFECTS) == 1


def test_a_permanent_failure_is_422_stored_and_replayed(client):
    job_targets.FAILURES["flaky"] = ["permanent"]
    first = start(client, job="flaky", status=422)
    assert first.json["status"] == "failed"
    assert first.json["error"]["message"] == "the invoice was rejected"
    again = start(client, job="flaky", status=422)
    assert again.json == {**first.json, "duplicate": True}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(job_targets.EFFECTS) == 1


@pytest.mark.parametrize("failure", ["retryable", "crash"])
def test_a_retryable_failure_is_500_and_the_retry_runs_again(client, ndb_client, failure):
    job_targets.FAILURES["flaky"] = [failure]
    failed = start(client, job="flaky", status=500)
    assert failed.json["error"] == "RetryableFailure"
    with ndb_client.context():
        assert [r.status for r in RunRecord.query().fetch()] == ["released"]  # kept, counting as absent
    retried = start(client, job="flaky", status=201)
    assert retried.json["attempt"] == 2
    assert len(job_targets.EFFECTS) == 2


def test_a_bad_result_is_a_stored_failure(client):
    job_targets.FAILURES["flaky"] = ["bad-result"]
    assert start(client, job="flaky", status=422).json["error"]["type"] == "InvalidResult"
    start(client, job="flaky", status=422)
    assert len(job_targets.EFFECTS) == 1


def test_in_progress_is_409_with_retry_after(client, clock):
    results = []
    thread = start_slow(client, "g1", results)
    clock.advance(10)
    busy = start(client, job="slow", parameters={"gate": "g1"}, status=409)
    assert busy.json["error"] == "RunInProgress"
    assert busy.headers["Retry-After"] == "30"  # a polling hint, not the whole 86000 s lease
    assert "Idempotency-Expires" in busy.headers
    job_targets.GATES["g1"].set()
    thread.join(10)
    assert results[0].status_int == 201
    assert len(job_targets.EFFECTS) == 1


def test_in_progress_with_other_parameters_is_still_a_conflict(client):
    results = []
    thread = start_slow(client, "g1", results)
    conflict = start(client, job="slow", parameters={"gate": "other"}, status=422)
    assert conflict.json["differing"] == ["gate"]
    job_targets.GATES["g1"].set()
    thread.join(10)


def test_prefer_wait_replays_the_first_runs_result(client):
    results = []
    thread = start_slow(client, "g1", results)
    threading.Timer(0.5, job_targets.GATES["g1"].set).start()
    waited = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=10"}, status=200)
    thread.join(10)
    assert waited.headers["Idempotent-Replayed"] == "true"
    assert waited.headers["Preference-Applied"] == "wait=10"
    assert waited.json == {**results[0].json, "duplicate": True}
    assert len(job_targets.EFFECTS) == 1


def test_prefer_wait_accepts_quoted_and_huge_values_capped_at_60(client):
    results = []
    thread = start_slow(client, "g1", results)
    threading.Timer(0.5, job_targets.GATES["g1"].set).start()
    waited = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": 'wait="99999999"'}, status=200)
    thread.join(10)
    assert waited.headers["Preference-Applied"] == "wait=60"
    fresh = start(client, token="fresh", headers={"Prefer": "wait=5"}, status=201)
    assert "Preference-Applied" not in fresh.headers  # nothing to wait for


@pytest.mark.parametrize(
    "body",
    [
        '{"clientToken": "t", "parameters": {"x": NaN}}',
        '{"clientToken": "t", "parameters": {"x": 1e400}}',
        '{"clientToken": "t", "parameters": {"x": "\\ud800"}}',
        '{"clientToken": "t", "parameters": {"\\udfff": 1}}',
        '{"clientToken": "t", "parameters": ' + "[" * 100000 + "]" * 100000 + "}",
        '{"clientToken": "t", "parameters": {"x": ' + "[" * 920 + "]" * 920 + "}}",  # parses; too deep to store
    ],
)
def test_json_that_cannot_be_fingerprinted_is_400(client, body):
    response = start(client, body=body, status=400)
    assert response.json["error"] == "InvalidParameterException"
    assert "not valid JSON" in response.json["message"]
    assert job_targets.EFFECTS == []


def test_parameters_too_large_to_store_beside_a_result_are_400(client):
    import random

    # 200,000 random two-byte characters: 400 kB on the wire, over 256 KiB even compressed.
    rng = random.Random(7)
    text = "".join(chr(rng.randrange(0x400, 0x4FF)) for _ in range(200_000))
    body = json.dumps({"clientToken": "big", "parameters": {"text": text}}, ensure_ascii=False)
    response = start(client, body=body.encode("utf-8"), status=400)
    assert response.json["error"] == "InvalidParameterException"
    assert "at most 262144 are kept" in response.json["message"]
    assert job_targets.EFFECTS == []
    # Repetitive text compresses to almost nothing, but readers decode it whole:
    # measured uncompressed (each "щ" is 6 bytes escaped), it is refused too.
    repetitive = json.dumps({"clientToken": "rep", "parameters": {"text": "щ" * 200_000}}, ensure_ascii=False)
    response = start(client, body=repetitive.encode("utf-8"), status=400)
    assert "take 1200011 bytes" in response.json["message"]
    # Just under the limit as stored: kept.
    fits = {"text": "щ" * ((262144 - len('{"text":""}')) // 6)}
    start(client, token="fits", body=json.dumps({"clientToken": "fits", "parameters": fits}), status=201)
    over = {"text": "x" * (262144 - len('{"text":""}') + 1)}
    start(client, token="over", body=json.dumps({"clientToken": "over", "parameters": over}), status=400)
    assert job_targets.EFFECTS[-1]["client_token"] == "fits" and len(job_targets.EFFECTS) == 1


def test_a_body_that_is_not_utf8_is_400(client):
    response = start(client, body=b'{"clientToken": "t\xff"}', status=400)
    assert response.json["error"] == "InvalidParameterException"


def test_prefer_wait_gives_up_with_409_and_is_capped(client):
    results = []
    thread = start_slow(client, "g1", results)
    busy = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "respond-async, wait=1"}, status=409)
    assert busy.headers["Preference-Applied"] == "wait=1"
    capped = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=0"}, status=409)
    assert "Preference-Applied" not in capped.headers
    job_targets.GATES["g1"].set()
    thread.join(10)
    from dedup.adapters.flask_guard import _PREFER_WAIT, MAX_WAIT_SECONDS

    assert MAX_WAIT_SECONDS == 60 and _PREFER_WAIT.match("wait=3600")


def test_expiry_is_finished_plus_one_hour_at_most(client, clock):
    first = start(client, status=201)
    expires = parse_time(first.headers["Idempotency-Expires"])
    clock.advance(HOUR - 1)
    assert parse_time(start(client, status=200).headers["Idempotency-Expires"]) == expires
    clock.advance(1)  # exactly at expire_at: counts as absent, even before TTL deletes it
    fresh = start(client, status=201)
    assert fresh.json["attempt"] == 2  # the fencing number keeps rising over the old record
    assert len(job_targets.EFFECTS) == 2


def test_expiry_is_created_plus_24_hours_for_a_long_run(client, clock):
    results = []
    created = clock.now()
    thread = start_slow(client, "g1", results)
    clock.advance(23.5 * HOUR)
    job_targets.GATES["g1"].set()
    thread.join(10)
    finished = results[0]
    assert finished.status_int == 201
    # min(created + 24 h, finished + 1 h) = created + 24 h
    assert parse_time(finished.headers["Idempotency-Expires"]) == created + datetime.timedelta(hours=24)
    clock.advance(0.5 * HOUR - 1)
    start(client, job="slow", parameters={"gate": "g1"}, status=200)
    clock.advance(1)
    job_targets.GATES.setdefault("g1", threading.Event()).set()
    assert start(client, job="slow", parameters={"gate": "g1"}, status=201).json["attempt"] == 2


def test_a_run_kept_as_a_response_before_manual_runs_kept_results_is_still_replayed(client, ndb_client):
    """Records written when manual runs kept their HTTP answer (for at most a day) replay it."""
    from dedup.stored_response import StoredResponse

    first = start(client, token="old-1", parameters={"value": 1}, status=201)
    with ndb_client.context():
        record = RunRecord.get_by_id(first.json["run_id"])
        record.result = StoredResponse.from_body(201, first.body, {"Content-Type": "application/json"}).document()
        record.put()
    again = start(client, token="old-1", parameters={"value": 1}, status=200)
    # Its kept body, or (from this process's memory of the run) the run's answer as a duplicate.
    assert {**again.json, "duplicate": False} == first.json and again.headers["Idempotent-Replayed"] == "true"
    assert len(job_targets.EFFECTS) == 1


def test_a_released_run_is_shown_with_its_error_until_its_retry_continues_it(client):
    job_targets.FAILURES["flaky"] = ["retryable"]
    failed = start(client, job="flaky", token="rel-1", status=500).json
    listed = client.get("/api/v1/runs?status=released").json["runs"]
    assert [(r["run_id"], r["status"], r["attempt"]) for r in listed] == [(failed["run_id"], "released", 1)]
    assert "the bank is busy" in listed[0]["preview"]
    shown = client.get(f"/api/v1/runs/{failed['run_id']}").json
    assert shown["error"]["message"] == "the bank is busy"
    assert [a["outcome"] for a in shown["attempts"]] == ["released"]
    page = client.get(f"/admin/runs/{failed['run_id']}")
    assert 'class="badge released"' in page.text
    start(client, job="flaky", token="rel-1", status=201)
    shown = client.get(f"/api/v1/runs/{failed['run_id']}").json
    assert shown["status"] == "completed" and shown["attempt"] == 2 and "error" not in shown
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "released"), (2, "completed")]
    assert client.get("/api/v1/runs?status=released").json["runs"] == []
