"""Chaos: the Datastore emulator goes away in the middle of a run and comes back."""

from __future__ import annotations

import threading
import time

import pytest
import webtest
from google.cloud import ndb

from devtools.emulator import DatastoreEmulator
from handlers import create_app
from models import RunRecord, RunStatus
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers

pytestmark = pytest.mark.slow


@pytest.fixture
def outage(jobs_file, clock, monkeypatch):
    job_targets.reset()
    with DatastoreEmulator(project="dedup-chaos", store_on_disk=True) as emulator:
        with monkeypatch.context() as patch:
            patch.setenv("DATASTORE_EMULATOR_HOST", emulator.host)  # read when the client is made
            client = ndb.Client(project=emulator.project)
        app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
        yield emulator, app, client


def test_an_outage_mid_run(outage):
    emulator, app, client = outage
    done = app.post("/jobs/invoice", headers=scheduler_headers(schedule_time="2026-06-01T00:00:00Z"), status=200)

    # A slow run holds its claim when Datastore goes away.
    results = []
    runner = threading.Thread(
        target=lambda: results.append(
            app.post(
                "/jobs/slow",
                b"outage",
                headers=scheduler_headers(scheduler_job_name="slow", schedule_time="2026-06-01T01:00:00Z"),
                status="*",
            )
        )
    )
    runner.start()
    for _ in range(200):
        if "outage" in job_targets.STARTED and job_targets.STARTED["outage"].is_set():
            break
        time.sleep(0.05)
    assert job_targets.STARTED["outage"].is_set(), "the slow job never started"
    effects_before = len(job_targets.EFFECTS)
    emulator._stop_process()
    assert not emulator.healthy()

    # While it is down: 500 (never 503), and no job runs without a committed claim.
    down = app.post("/jobs/invoice", headers=scheduler_headers(schedule_time="2026-06-01T02:00:00Z"), status="*")
    assert down.status_int == 500
    assert len(job_targets.EFFECTS) == effects_before

    # The slow run finishes during the outage; its completion keeps trying until Datastore is back.
    job_targets.GATES["outage"].set()
    time.sleep(1)
    emulator.start()
    runner.join(60)
    assert results[0].status_int == 200 and results[0].json["duplicate"] is False

    # Nothing was lost: the earlier run is still completed, the slow one completed once.
    again = app.post("/jobs/invoice", headers=scheduler_headers(schedule_time="2026-06-01T00:00:00Z"), status=200)
    assert again.json["duplicate"] is True and again.json["result"] == done.json["result"]
    with client.context():
        slow = RunRecord.get_by_id(results[0].json["run_id"])
        assert slow.status == RunStatus.COMPLETED and slow.attempt == 1
        # The run attempted during the outage left nothing.
        assert len(RunRecord.query().fetch(10, keys_only=True)) == 2
    # The delivery refused during the outage runs now, once.
    app.post("/jobs/invoice", headers=scheduler_headers(schedule_time="2026-06-01T02:00:00Z"), status=200)
    assert [e["schedule_time"].hour for e in job_targets.EFFECTS].count(2) == 1
