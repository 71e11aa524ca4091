"""Issue 22 §§1-2 on gunicorn and the emulator: the guard's rules as a client meets them.

Two worker processes, so a retry may land on another process than the first call.
"""

from __future__ import annotations

import pytest
import requests

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
