"""Steps on a real gunicorn: a worker SIGKILLed after a step's effect and before its record.

The python job (tests.job_targets:file_steps) has three steps; its attempt 1 dies right after
one step's effect.  After the lease, Cloud Scheduler's retry (attempt 2) resumes from the last
recorded step: an at_least_once step killed before its record is called again with the same key
(a downstream deduplicating on it applies it once); the at_most_once charge is never called
again: the run waits for review.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time

import pytest
import requests

from tests.support.live import serving

pytestmark = pytest.mark.live

JOBS = """
jobs:
  stepped:
    kind: python
    target: tests.job_targets:file_steps
    lease_seconds: 3
"""


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    with serving(emulator, tmp_path_factory.mktemp("live-steps"), JOBS) as running:
        yield running


def deliver(server, schedule_time: str, body: dict, timeout: float = 30) -> requests.Response:
    return requests.post(
        f"{server.url}/jobs/stepped",
        data=json.dumps(body),
        headers={"X-CloudScheduler-JobName": "live-stepped", "X-CloudScheduler-ScheduleTime": schedule_time},
        timeout=timeout,
    )


def calls(directory) -> list[dict]:
    lines = []
    for name in os.listdir(directory):
        if name.endswith(".steps"):
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                lines += [json.loads(line) for line in handle]
    return lines


@pytest.mark.parametrize(
    ("kill_in", "status", "called"),
    [
        ("reserve", 200, {"reserve": 2, "charge": 1, "notify": 1}),  # called again, same key
        ("charge", 422, {"reserve": 1, "charge": 1, "notify": 0}),  # never again: review
        ("notify", 200, {"reserve": 1, "charge": 1, "notify": 2}),
    ],
)
def test_a_worker_killed_after_a_steps_effect_resumes_from_the_last_recorded_step(
    server, datastore, tmp_path, kill_in, status, called
):
    pidfile = tmp_path / "pid"
    when = {"reserve": "2026-06-01T00:00:00Z", "charge": "2026-06-01T01:00:00Z", "notify": "2026-06-01T02:00:00Z"}[
        kill_in
    ]
    body = {"dir": str(tmp_path), "kill_in": kill_in, "pidfile": str(pidfile)}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(deliver, server, when, body, 90)
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        pid, attempt = map(int, pidfile.read_text().split())
        assert attempt == 1
        os.kill(pid, signal.SIGKILL)  # after the effect, before the step's record
        with pytest.raises(requests.RequestException):
            first.result()
    time.sleep(3.5)  # one 3 s lease later, Scheduler's retry takes the run over
    retried = deliver(server, when, body)
    assert retried.status_code == status, retried.text
    assert retried.json()["attempt"] == 2
    seen = calls(tmp_path)
    assert {step: sum(1 for c in seen if c["step"] == step) for step in called} == called
    # Every call of a step passed that step's one key: a downstream deduplicating on it applies it once.
    for step in called:
        assert len({c["key"] for c in seen if c["step"] == step}) <= 1
    if status == 422:
        assert retried.json()["error"]["type"] == "NeedsReview"
        assert retried.json()["error"]["details"]["step"] == "charge"
