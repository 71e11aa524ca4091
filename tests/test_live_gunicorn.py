"""Real parallel HTTP deliveries against a real gunicorn and the real emulator."""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import threading

import pytest
import requests

from dedup.keys import parse_rfc3339
from tests.support.live import serving

pytestmark = pytest.mark.live

JOBS = """
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 30
  short-lease:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 2
    heartbeat: false
  renewed:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 3
"""


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory):
    with serving(emulator, tmp_path_factory.mktemp("live"), JOBS) as running:
        yield running


@pytest.fixture
def effects_dir(datastore, tmp_path):
    return tmp_path


def effects(effects_dir) -> list[dict]:
    lines = []
    for name in os.listdir(effects_dir):
        with open(effects_dir / name) as handle:
            lines += [json.loads(line) for line in handle]
    return lines


def deliver(server, job, schedule_time, body, timeout=30):
    return requests.post(
        f"{server.url}/jobs/{job}",
        data=json.dumps(body),
        headers={"X-CloudScheduler-JobName": f"live-{job}", "X-CloudScheduler-ScheduleTime": schedule_time},
        timeout=timeout,
    )


def deliver_concurrently(server, count, job, schedule_time, body):
    barrier = threading.Barrier(count)

    def one(_):
        barrier.wait()
        return deliver(server, job, schedule_time, body)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_16_concurrent_deliveries_run_the_job_once(server, effects_dir):
    body = {"dir": str(effects_dir), "sleep": 1.5}
    responses = deliver_concurrently(server, 16, "effect", "2026-01-01T00:00:00Z", body)
    statuses = sorted(r.status_code for r in responses)
    assert all(status in (200, 409) for status in statuses), statuses
    fresh = [r for r in responses if r.status_code == 200 and not r.json()["duplicate"]]
    assert len(fresh) == 1
    for busy in (r for r in responses if r.status_code == 409):
        assert int(busy.headers["Retry-After"]) >= 1
        assert busy.json()["error"] in ("RunInProgress", "RunContended")
    assert len(effects(effects_dir)) == 1

    # Once completed, every further delivery is a duplicate 200 answered from the record.
    again = deliver_concurrently(server, 16, "effect", "2026-01-01T00:00:00Z", body)
    assert {r.status_code for r in again} == {200}
    assert all(r.json()["duplicate"] for r in again)
    assert {r.json()["run_id"] for r in again} == {fresh[0].json()["run_id"]}
    assert len(effects(effects_dir)) == 1


def test_distinct_executions_in_parallel_each_run_once(server, effects_dir):
    body = {"dir": str(effects_dir), "sleep": 0.2}
    times = [f"2026-01-01T00:{minute:02d}:00Z" for minute in range(8)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda t: deliver(server, "effect", t, body), times * 2))
    assert all(r.status_code in (200, 409) for r in responses)
    assert len(effects(effects_dir)) == 8
    assert len({line["pid"] for line in effects(effects_dir)}) >= 1


def test_a_heartbeat_keeps_a_short_lease_alive_while_the_job_runs(server, effects_dir):
    # A 3 s lease renewed every second: a duplicate 5 s into a 7 s run finds the
    # lease live (409), not expired, and the job runs once.
    slow = {"dir": str(effects_dir), "sleep": 7}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(deliver, server, "renewed", "2026-03-01T00:00:00Z", slow)
        threading.Event().wait(5)
        busy = deliver(server, "renewed", "2026-03-01T00:00:00Z", slow)
        done = first.result()
    assert busy.status_code == 409 and busy.json()["error"] == "RunInProgress"
    assert done.status_code == 200 and done.json()["attempt"] == 1
    assert len(effects(effects_dir)) == 1


def test_an_overrunning_attempt_is_taken_over_after_its_lease(server, effects_dir):
    # Without a heartbeat, attempt 1 outlives its 2 s lease (as when Scheduler's
    # attemptDeadline passes); the next delivery takes over as attempt 2 and
    # the late attempt 1 is refused as stale.
    slow = {"dir": str(effects_dir), "sleep": 4}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(deliver, server, "short-lease", "2026-02-01T00:00:00Z", slow)
        threading.Event().wait(0.8)
        busy = deliver(server, "short-lease", "2026-02-01T00:00:00Z", slow)
        assert busy.status_code == 409
        threading.Event().wait(2.0)  # past the lease
        takeover = deliver(server, "short-lease", "2026-02-01T00:00:00Z", {"dir": str(effects_dir), "sleep": 0})
        stale = first.result()
    assert takeover.status_code == 200 and takeover.json()["attempt"] == 2
    assert stale.status_code == 409 and stale.json()["error"] == "StaleAttempt"
    replay = deliver(server, "short-lease", "2026-02-01T00:00:00Z", slow)
    assert replay.status_code == 200 and replay.json()["attempt"] == 2 and replay.json()["duplicate"]


def test_16_concurrent_manual_runs_with_one_token_run_once(server, effects_dir):
    barrier = threading.Barrier(16)
    payload = {"clientToken": "deploy-42", "parameters": {"dir": str(effects_dir), "sleep": 1.5}}

    def one(_):
        barrier.wait()
        return requests.post(f"{server.url}/api/v1/jobs/effect/runs", json=payload, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(one, range(16)))
    statuses = [r.status_code for r in responses]
    assert statuses.count(201) == 1, statuses
    assert all(status in (200, 201, 409) for status in statuses), statuses
    assert len(effects(effects_dir)) == 1
    replay = requests.post(f"{server.url}/api/v1/jobs/effect/runs", json=payload, timeout=30)
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert len(effects(effects_dir)) == 1
    # A manual run keeps the ECS token rule, min(created + 24 h, finished + 1 h), not the guard's 24 h.
    run = requests.get(f"{server.url}/api/v1/runs/{replay.json()['run_id']}", timeout=30).json()
    finished = parse_rfc3339(run["finished"], "finished")
    expires = parse_rfc3339(replay.headers["Idempotency-Expires"], "Idempotency-Expires")
    assert expires == finished + datetime.timedelta(hours=1)


def test_64_concurrent_deliveries_of_one_execution(server, effects_dir):
    body = {"dir": str(effects_dir), "sleep": 1}
    responses = deliver_concurrently(server, 64, "effect", "2026-04-01T00:00:00Z", body)
    statuses = [r.status_code for r in responses]
    assert all(status in (200, 409) for status in statuses), sorted(set(statuses))
    assert sum(1 for r in responses if r.status_code == 200 and not r.json()["duplicate"]) == 1
    assert len(effects(effects_dir)) == 1


def test_a_worker_killed_mid_job_is_taken_over_after_its_lease(server, effects_dir, tmp_path_factory):
    import os
    import signal
    import time

    pidfile = tmp_path_factory.mktemp("kill") / "pid"
    body = {"dir": str(effects_dir), "sleep": 30, "pidfile": str(pidfile)}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(deliver, server, "renewed", "2026-05-01T00:00:00Z", body, 60)
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.1)
        pid, attempt = map(int, pidfile.read_text().split())
        assert attempt == 1
        os.kill(pid, signal.SIGKILL)  # the worker dies mid-job, with its heartbeat
        with pytest.raises(requests.RequestException):
            first.result()
    busy = deliver(server, "renewed", "2026-05-01T00:00:00Z", {"dir": str(effects_dir)})
    assert busy.status_code == 409  # the lease outlives the worker by at most one lease
    time.sleep(3.5)  # one 3 s lease later
    taken = deliver(server, "renewed", "2026-05-01T00:00:00Z", {"dir": str(effects_dir), "sleep": 0})
    assert taken.status_code == 200 and taken.json()["attempt"] == 2
    assert [line["attempt"] for line in effects(effects_dir)] == [2]  # the side effect happened once
