"""``Prefer: wait`` is bounded per process: waiting retries can never take every server
thread.  Beyond the bound a retry gets the immediate 409 with Retry-After, exactly as
without ``Prefer``, and no ``Preference-Applied``."""

from __future__ import annotations

import concurrent.futures
import os
import textwrap
import threading
import time

import pytest
import requests
import webtest

from dedup.adapters.flask_guard import DEFAULT_MAX_WAITERS, GUARD_EXTENSION
from devtools.gunicorn import GunicornServer
from handlers import SettingError, create_app, max_waiters_from_environ
from tests import job_targets
from tests.support.manual_runs import JOBS, start, start_slow


@pytest.fixture
def bounded(datastore, ndb_client, jobs_file, clock):
    def build(max_waiters: int) -> webtest.TestApp:
        app = create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client, max_waiters=max_waiters)
        return webtest.TestApp(app)

    return build


def slots(client):
    return client.app.extensions[GUARD_EXTENSION].wait_slots


def wait_until(condition, what: str) -> None:
    for _ in range(400):
        if condition():
            return
        time.sleep(0.025)
    raise AssertionError(f"never: {what}")


def test_beyond_the_bound_a_retry_is_answered_at_once_as_without_prefer(bounded):
    client = bounded(1)
    results, waited = [], []
    first = start_slow(client, "g1", results)
    waiter = threading.Thread(
        target=lambda: waited.append(
            start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=30"})
        )
    )
    waiter.start()
    wait_until(lambda: slots(client).taken == 1, "the first retry waits")

    refused = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=30"}, status=409)
    plain = start(client, job="slow", parameters={"gate": "g1"}, status=409)
    assert refused.json["error"] == "RunInProgress" == plain.json["error"]
    assert refused.headers["Retry-After"] == plain.headers["Retry-After"]
    assert "Preference-Applied" not in refused.headers
    assert waiter.is_alive()  # still waiting: the refusal did not wait for it

    job_targets.GATES["g1"].set()
    first.join(10)
    waiter.join(10)
    assert waited[0].status_int == 200 and waited[0].headers["Preference-Applied"] == "wait=30"
    assert slots(client).taken == 0
    assert len(job_targets.EFFECTS) == 1


def test_a_bound_of_zero_never_waits(bounded):
    client = bounded(0)
    results = []
    first = start_slow(client, "g1", results)
    busy = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=30"}, status=409)
    assert "Preference-Applied" not in busy.headers
    job_targets.GATES["g1"].set()
    first.join(10)


@pytest.mark.slow
def test_a_slot_is_given_back_when_the_wait_times_out_and_after_each_outcome(bounded):
    client = bounded(1)
    results = []
    first = start_slow(client, "g1", results)
    for _ in range(3):  # each timed-out wait frees its slot for the next
        busy = start(client, job="slow", parameters={"gate": "g1"}, headers={"Prefer": "wait=1"}, status=409)
        assert busy.headers["Preference-Applied"] == "wait=1"
        assert slots(client).taken == 0
    job_targets.GATES["g1"].set()
    first.join(10)
    # A fresh run and a replay never take a slot.
    start(client, token="fresh", headers={"Prefer": "wait=5"}, status=201)
    start(client, token="fresh", headers={"Prefer": "wait=5"}, status=200)
    assert slots(client).taken == 0


@pytest.mark.parametrize("raw, expected", [("", DEFAULT_MAX_WAITERS), ("0", 0), (" 3 ", 3), ("64", 64)])
def test_max_waiters_setting(raw, expected):
    assert max_waiters_from_environ({"DEDUP_MAX_WAITERS": raw}) == expected


@pytest.mark.parametrize("raw", ["-1", "65", "1000", "two", "1.5", "²", "0x2", "1e1"])
def test_a_bad_max_waiters_setting_stops_the_app(raw, jobs_file):
    with pytest.raises(SettingError, match="DEDUP_MAX_WAITERS"):
        max_waiters_from_environ({"DEDUP_MAX_WAITERS": raw})
    os.environ["DEDUP_MAX_WAITERS"] = raw
    try:
        with pytest.raises(SettingError):
            create_app(jobs_file=jobs_file(JOBS))
    finally:
        del os.environ["DEDUP_MAX_WAITERS"]


LIVE_JOBS = """
jobs:
  long:
    kind: python
    target: tests.job_targets:file_gate
    lease_seconds: 60
"""


@pytest.mark.live
def test_waiting_retries_cannot_starve_a_gunicorn_worker(emulator, datastore, tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(textwrap.dedent(LIVE_JOBS))
    gate = tmp_path / "gate"
    payload = {"clientToken": "long-1", "parameters": {"gate_file": str(gate)}}
    # One worker with 4 threads, one of which may wait: the run takes one, a waiter one.
    with GunicornServer(
        emulator, str(jobs), workers=1, threads=4, quiet=True, extra_env={"DEDUP_MAX_WAITERS": "1"}
    ) as server:
        url = f"{server.url}/api/v1/jobs/long/runs"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            first = pool.submit(requests.post, url, json=payload, timeout=60)
            wait_until(lambda: requests.get(f"{server.url}/api/v1/runs", timeout=10).json()["runs"], "the run starts")
            retries = [
                pool.submit(requests.post, url, json=payload, headers={"Prefer": "wait=50"}, timeout=60)
                for _ in range(6)
            ]
            # Five are answered while the run still holds its lease, as without Prefer; one waits.
            wait_until(lambda: sum(r.done() for r in retries) == 5, "five retries are answered")
            done = [r.result() for r in retries if r.done()]
            (waiter,) = [r for r in retries if not r.done()]
            assert not gate.exists()
            assert all(r.status_code == 409 and "Preference-Applied" not in r.headers for r in done)
            assert all(r.json()["error"] == "RunInProgress" and int(r.headers["Retry-After"]) >= 1 for r in done)
            # An unrelated read is served while the run and the waiter hold their threads.
            listed = requests.get(f"{server.url}/api/v1/runs", timeout=10)
            assert listed.status_code == 200 and not waiter.done() and not gate.exists()
            gate.touch()
            assert first.result().status_code == 201
            assert waiter.result().status_code == 200
            assert waiter.result().headers["Preference-Applied"] == "wait=50"
