"""A gunicorn slice of the delivery tests on each of Google's Datastore-mode emulators.

Each worker checks the database's fence at start-up: on the legacy emulator it takes the fenced
path, on the Firestore emulator (which applies a stale version) the transactional one, and on
both, 16 parallel deliveries of one execution run the job once, and a retryable failure's retry
runs it once more.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import requests

from tests.support.live import serving
from tests.test_live_gunicorn import JOBS, effects  # the same jobs, "effect" among them

pytestmark = [pytest.mark.live, pytest.mark.both_emulators]

PATH = {"legacy": "version", "firestore": "transaction"}


@pytest.fixture
def server(datastore, tmp_path):
    (tmp_path / "app").mkdir()
    with serving(datastore, tmp_path / "app", JOBS) as running:
        yield running


def deliver(server, schedule_time: str, body: dict) -> requests.Response:
    return requests.post(
        f"{server.url}/jobs/effect",
        json=body,
        headers={"X-CloudScheduler-JobName": "live-effect", "X-CloudScheduler-ScheduleTime": schedule_time},
        timeout=60,
    )


def wait_for_the_check(server, expected: str) -> None:
    """Until the workers' start-up checks have answered (they run beside the requests): every
    answer of 20 (from both workers, gunicorn's two) names the path, and none says it is unchecked."""
    from dedup.fence_check import UNCHECKED

    deadline = time.monotonic() + 30
    seen: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        answers = [requests.get(f"{server.url}/api/v1/status", timeout=10).json()["datastore"] for _ in range(20)]
        seen = {(answer["fence"], answer["reason"]) for answer in answers}
        if {fence for fence, _ in seen} == {expected} and UNCHECKED.reason not in {reason for _, reason in seen}:
            return
        time.sleep(0.1)
    raise AssertionError(f"the workers report {seen}, not {expected}")


def test_16_parallel_deliveries_run_once_on_the_path_the_check_chose(server, tmp_path, datastore_flavor):
    wait_for_the_check(server, PATH[datastore_flavor])
    effects_dir = tmp_path / "effects"
    effects_dir.mkdir()
    body = {"dir": str(effects_dir), "sleep": 1.0}
    barrier = threading.Barrier(16)

    def one(_):
        barrier.wait()
        return deliver(server, "2026-01-01T00:00:00Z", body)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(one, range(16)))
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 409}, statuses  # never a 5xx
    assert len([r for r in responses if r.status_code == 200 and not r.json()["duplicate"]]) == 1
    assert len(effects(effects_dir)) == 1
    again = deliver(server, "2026-01-01T00:00:00Z", body)
    assert again.status_code == 200 and again.json()["duplicate"]
    assert len(effects(effects_dir)) == 1


def test_a_failed_attempt_is_released_and_its_retry_runs_once_more(server, tmp_path, datastore_flavor):
    wait_for_the_check(server, PATH[datastore_flavor])
    effects_dir = tmp_path / "effects"
    effects_dir.mkdir()
    first = deliver(server, "2026-01-01T02:00:00Z", {"dir": str(effects_dir / "absent")})  # the job raises
    assert first.status_code == 500
    retried = deliver(server, "2026-01-01T02:00:00Z", {"dir": str(effects_dir)})
    assert retried.status_code == 200 and retried.json()["attempt"] == 2
    assert [line["attempt"] for line in effects(effects_dir)] == [2]
