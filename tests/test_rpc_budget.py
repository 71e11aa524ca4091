"""Datastore round trips per outcome, counted on the wire against the emulator.

The counts are behaviour, not speed: they are what each delivery costs in
Datastore operations and latency in production.
"""

from __future__ import annotations

import pytest
import webtest

from devtools.rpc_counter import counting_client
from handlers import create_app
from tests.support.deliveries import JOBS, scheduler_headers


@pytest.fixture
def counted(datastore, jobs_file, clock):
    client, counter = counting_client(datastore.project)
    app = create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client)
    return webtest.TestApp(app), counter


def test_a_completed_duplicate_costs_one_lookup_and_none_in_the_process_that_saw_it(
    counted, datastore, jobs_file, clock
):
    app, counter = counted
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    counter.reset()
    replay = app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert replay.json["duplicate"] is True and counter.snapshot() == {}  # this process finished it
    other_client, other_counter = counting_client(datastore.project)  # another instance
    other = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=other_client))
    other.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    other_counter.wait_until_idle()
    # One lookup answers; the insert sent beside it, should the run be fresh, is refused
    # (tests/test_round_trips.py: one round trip on the answer's path).
    assert other_counter.snapshot() == {"Lookup": 1, "Commit": 1}
    other_counter.reset()
    other.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert other_counter.snapshot() == {}  # it replayed it once: now it remembers


def test_a_fresh_run_costs_a_lookup_and_two_commits(counted):
    """The lookup beside the claim's insert, and the finish fenced on the claim's version."""
    app, counter = counted
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert counter.snapshot() == {"Lookup": 1, "Commit": 2}


def test_bad_input_costs_nothing(counted):
    app, counter = counted
    app.post("/jobs/invoice", headers=scheduler_headers(schedule_time="nope"), status=400)
    app.post("/jobs/nope", headers=scheduler_headers(), status=404)
    assert counter.total == 0


def test_forbidding_overlap_reads_the_lock_with_the_run(datastore, jobs_file, clock):
    """The job's lock is read with the run in one batch lookup and written in the same commits:
    a transaction for the claim, begun by its Lookup, and the finish's one fenced commit."""
    client, counter = counting_client(datastore.project)
    exclusive = JOBS.replace("    lease_seconds: 60\n", "    lease_seconds: 60\n    overlap: forbid\n", 1)
    assert "overlap: forbid" in exclusive
    app = webtest.TestApp(create_app(jobs_file=jobs_file(exclusive), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert counter.snapshot() == {"Lookup": 1, "Commit": 2}
