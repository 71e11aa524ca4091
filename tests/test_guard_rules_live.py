"""Issue 22 §§1-2 on gunicorn and the emulator: the guard's rules as a client meets them.

Two worker processes, so a retry may land on another process than the first call.
"""

from __future__ import annotations

import datetime

import pytest
import requests

from dedup.keys import parse_rfc3339
from devtools.gunicorn import GunicornServer

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    folder = tmp_path_factory.mktemp("guard-rules")
    (folder / "jobs.yaml").write_text("jobs: {}\n")
    env = {"GUARD_EFFECTS_DIR": str(folder), "DEDUP_FINISHED_CACHE_ENTRIES": "0"}
    with GunicornServer(emulator, str(folder / "jobs.yaml"), 2, 2, app="tests.guard_app:app", extra_env=env) as running:
        running.effects = folder / "effects"
        yield running


@pytest.fixture
def guarded(server, datastore):
    server.effects.unlink(missing_ok=True)
    return server


def effects(server) -> int:
    return len(server.effects.read_text().splitlines()) if server.effects.exists() else 0


def send(server, body: bytes, key: str = '"k-1"', caller: str = "alice", method: str = "POST"):
    headers = {"Idempotency-Key": key, "X-Caller": caller, "Content-Type": "application/json"}
    return requests.request(method, f"{server.url}/orders", data=body, headers=headers, timeout=30)


def test_a_retry_re_spelled_and_keyed_as_a_bare_token_is_the_same_request(guarded):
    first = send(guarded, b'{"item": "book", "qty": 1}')
    again = send(guarded, b'{"qty":1,"item":"book"}', key="k-1")  # another library's JSON, the key unquoted
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert effects(guarded) == 1


def test_another_caller_with_the_same_key_is_another_request(guarded):
    alice = send(guarded, b'{"item": "book"}', caller="alice")
    mallory = send(guarded, b'{"item": "book"}', caller="mallory")
    assert "Idempotent-Replayed" not in mallory.headers and mallory.json() != alice.json()
    assert effects(guarded) == 2


def test_a_corrected_request_after_a_400_runs_under_the_same_key(guarded):
    assert send(guarded, b"{}").status_code == 400
    fixed = send(guarded, b'{"item": "pen"}')
    assert fixed.status_code == 201 and "Idempotent-Replayed" not in fixed.headers and effects(guarded) == 1


def test_a_get_passes_straight_through_and_a_list_of_keys_is_400(guarded):
    assert requests.get(f"{guarded.url}/orders", timeout=30).json() == {"listed": True}  # no key: no 400
    assert send(guarded, b'{"item": "book"}', key='"a", "b"').status_code == 400
    assert effects(guarded) == 0


def post_json(server, path: str, document: dict, key: str | None = '"k-1"', caller: str = "alice"):
    headers = {"X-Caller": caller} if key is None else {"X-Caller": caller, "Idempotency-Key": key}
    return requests.post(f"{server.url}{path}", json=document, headers=headers, timeout=30)


def parse_time(text: str) -> datetime.datetime:
    return parse_rfc3339(text, "Idempotency-Expires")


def stored_expiry(datastore, namespace: str) -> tuple[datetime.datetime, datetime.datetime]:
    """The expiry and finish of the one record of ``namespace`` (the guard's job id)."""
    from google.cloud import ndb

    from models import RunRecord

    with ndb.Client(project=datastore.project).context():
        (record,) = RunRecord.query(RunRecord.job_id == namespace).fetch()
        assert record.finished is not None
        return record.expire_at, record.finished


def test_a_guarded_key_is_remembered_24_hours_after_the_call_finishes(guarded, datastore):
    first = send(guarded, b'{"item": "book"}')
    expires = parse_time(first.headers["Idempotency-Expires"])
    again = send(guarded, b'{"item": "book"}')
    assert (
        again.headers["Idempotent-Replayed"] == "true" and parse_time(again.headers["Idempotency-Expires"]) == expires
    )
    expire_at, finished = stored_expiry(datastore, "orders")
    # What the header says is what the record keeps: 24 h from the finish, not the ECS rule's 1 h.
    assert expire_at.replace(tzinfo=datetime.UTC) == expires
    assert expires - finished.replace(tzinfo=datetime.UTC) >= datetime.timedelta(hours=24)


def test_kept_validation_and_server_errors_are_replayed_not_run_again(guarded):
    refused = post_json(guarded, "/orders-kept", {}, key='"v-1"')
    assert refused.status_code == 400
    assert post_json(guarded, "/orders-kept", {}, key='"v-1"').headers["Idempotent-Replayed"] == "true"
    failed = post_json(guarded, "/orders-kept", {"item": "book", "fail": True}, key='"s-1"')
    again = post_json(guarded, "/orders-kept", {"item": "book", "fail": True}, key='"s-1"')
    assert failed.status_code == again.status_code == 500 and again.json() == failed.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert effects(guarded) == 1  # the failed call's effect, once: its retry was answered, not run


def test_an_integer_key_field_is_its_decimal_string_across_processes(guarded):
    first = post_json(guarded, "/orders-by-id", {"order_id": 42, "item": "book"}, key=None)
    again = post_json(guarded, "/orders-by-id", {"order_id": 42, "item": "book"}, key=None)
    assert first.status_code == again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    # "42" is the same key, never a second run; under the default fingerprint (the whole body)
    # it is another body, so 422 rather than a replay.
    respelled = post_json(guarded, "/orders-by-id", {"order_id": "42", "item": "book"}, key=None)
    assert respelled.status_code == 422 and respelled.json()["error"] == "ConflictException"
    refused = post_json(guarded, "/orders-by-id", {"order_id": 4.2, "item": "book"}, key=None)
    assert refused.status_code == 400 and refused.headers["Content-Type"] == "application/problem+json"
    assert "order_id must be a string or an integer, not float" in refused.json()["detail"]
    assert effects(guarded) == 1
