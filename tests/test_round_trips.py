"""Sequential Datastore round trips per outcome: what each answer costs in latency.

Every call goes through ``devtools/latency_proxy.py`` (a round trip of
ROUND_TRIP_MS), so calls the code sends together are in flight together
and calls that wait for one another do not overlap.  The count is the
longest chain of calls each sent after the one before was answered, among
the calls answered before the response was: a rollback sent without
waiting is not on the answer's path.  These are counts, not timings.
"""

from __future__ import annotations

import datetime
import time

import pytest
import webtest
from flask import Flask, jsonify, request

from dedup.adapters.flask_guard import idempotent, install_guard
from dedup.job_lock import JobLock
from dedup.keys import ScheduledRunKey
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Finished, Renewed
from devtools.latency_proxy import DelayingProxy
from devtools.rpc_counter import counting_client
from handlers import NdbContextMiddleware, create_app
from models import RunRecord
from tests.support import manual_runs
from tests.support.deliveries import JOBS, T0, scheduler_headers

ROUND_TRIP_MS = 40  # long against the time Python takes between two sends
POLICY = RunPolicy(600, 7200)


@pytest.fixture
def proxy(datastore):
    host, port = datastore.host.rsplit(":", 1)
    with DelayingProxy(host, int(port), ROUND_TRIP_MS / 2) as delaying:
        yield delaying


@pytest.fixture
def slow_client(proxy, datastore):
    """A counted NDB client that reaches the emulator one round trip away."""
    return counting_client(datastore.project, proxy.host)


def round_trips(counter, send) -> tuple[object, int]:
    """``send()``'s answer, and the sequential round trips on its path."""
    counter.wait_until_idle()
    counter.reset()
    answer = send()
    answered = time.monotonic()
    return answer, counter.sequential_round_trips(until=answered)


@pytest.fixture
def delivering(slow_client, jobs_file, clock):
    client, counter = slow_client
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))

    def deliver(schedule_time=T0, status=200):
        return round_trips(
            counter,
            lambda: app.post("/jobs/invoice", headers=scheduler_headers(schedule_time=schedule_time), status=status),
        )

    return deliver, counter


def test_a_fresh_run_costs_two_round_trips(delivering):
    deliver, counter = delivering
    response, trips = deliver()
    assert response.json["duplicate"] is False
    assert trips == 2  # the lookup and the claim's insert together; the finish fenced on its version
    counter.wait_until_idle()
    assert counter.snapshot() == {"Lookup": 1, "Commit": 2}  # nothing else sent


def test_a_completed_duplicate_costs_one_round_trip_and_none_where_it_was_seen(
    delivering, slow_client, datastore, jobs_file, clock
):
    deliver, counter = delivering
    deliver()
    response, trips = deliver()
    assert response.json["duplicate"] is True and trips == 0  # this process finished it
    other_client, other_counter = counting_client(datastore.project, slow_client[0].host)
    other = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=other_client))
    response, trips = round_trips(other_counter, lambda: other.post("/jobs/invoice", headers=scheduler_headers()))
    assert response.json["duplicate"] is True and trips == 1  # another instance: one lookup
    other_counter.wait_until_idle()
    # The claim's insert went beside the lookup, and was refused: the record is there.
    assert other_counter.snapshot() == {"Lookup": 1, "Commit": 1}


def test_an_in_progress_duplicate_costs_one_round_trip(delivering, slow_client, clock):
    deliver, _ = delivering
    client, _ = slow_client
    schedule_time = "2025-10-18T00:00:00Z"
    held = ScheduledRunKey("", "", "nightly-invoice", datetime.datetime(2025, 10, 18, tzinfo=datetime.UTC))
    with client.context():  # an attempt that holds a live lease
        Ledger(clock).claim_run(held.run_id, RunDescription("scheduler", "invoice"), RunPolicy(600, 7200))
    response, trips = deliver(schedule_time, status=409)
    assert trips == 1 and response.headers["Retry-After"]


def test_a_lease_renewal_costs_one_round_trip(slow_client, clock):
    client, counter = slow_client
    ledger = Ledger(clock)
    with client.context():
        owner = ledger.replay_or_claim("renewed", RunDescription("scheduler", "invoice"), RunPolicy(600, 7200)).attempt
        renewed, trips = round_trips(counter, lambda: ledger.renew_lease(owner, 600))
        assert isinstance(renewed, Renewed) and trips == 1  # an update fenced on the claim's version
        clock.advance(1)
        again, trips = round_trips(counter, lambda: ledger.renew_lease(owner, 600))
        assert isinstance(again, Renewed) and trips == 1  # and on the renewal's


def test_a_renewal_whose_version_moved_costs_three(slow_client, clock):
    """The record was written since the attempt's last write (here by hand): the fenced update is
    refused, and a transaction reads the record (its Lookup begins it) and renews it."""
    client, counter = slow_client
    ledger = Ledger(clock)
    with client.context():
        owner = ledger.replay_or_claim("renewed", RunDescription("scheduler", "invoice"), RunPolicy(600, 7200)).attempt
        record = RunRecord.get_by_id("renewed")
        record.updated = clock.now() + datetime.timedelta(seconds=1)
        record.put()
        renewed, trips = round_trips(counter, lambda: ledger.renew_lease(owner, 600))
        assert isinstance(renewed, Renewed) and trips == 3  # the refused update; Lookup; Commit
        again, trips = round_trips(counter, lambda: ledger.renew_lease(owner, 600))
        assert isinstance(again, Renewed) and trips == 1  # fenced again, on the transaction's version


def test_a_manual_run_and_its_retry(slow_client, jobs_file, clock):
    client, counter = slow_client
    app = webtest.TestApp(create_app(jobs_file=jobs_file(manual_runs.JOBS), clock=clock, ndb_client=client))
    first, trips = round_trips(counter, lambda: manual_runs.start(app, parameters={"customer": "c-1"}, status=201))
    assert trips == 2
    again, trips = round_trips(counter, lambda: manual_runs.start(app, parameters={"customer": "c-1"}, status=200))
    assert again.json == {**first.json, "duplicate": True} and trips == 0  # finished here: remembered


def test_a_guarded_endpoint_and_its_retry(slow_client, clock):
    client, counter = slow_client
    app = Flask(__name__)
    install_guard(app, Ledger(clock))
    effects = []

    @app.post("/orders")
    @idempotent("orders")
    def create_order():
        effects.append(request.get_json())
        return jsonify({"order": len(effects)}), 201

    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, client)
    http = webtest.TestApp(app)
    headers = {"Idempotency-Key": "order-1"}
    first, trips = round_trips(counter, lambda: http.post_json("/orders", {"sku": "a"}, headers=headers, status=201))
    assert trips == 2
    again, trips = round_trips(counter, lambda: http.post_json("/orders", {"sku": "a"}, headers=headers, status=201))
    assert again.json == first.json and trips == 0 and len(effects) == 1


def test_what_a_fresh_run_and_its_duplicates_are_billed(delivering):
    """Entity reads and writes, as the cost model in docs/retention-and-cost.md counts them."""
    deliver, counter = delivering
    deliver()
    counter.wait_until_idle()
    assert counter.billed() == {"reads": 1, "writes": 2, "deletes": 0}  # the lookup (missing); insert, update
    deliver()
    counter.wait_until_idle()
    assert counter.billed() == {"reads": 0, "writes": 0, "deletes": 0}  # remembered: nothing billed


@pytest.mark.parametrize("speculate, claim_trips", [(True, 1), (False, 3)])
def test_a_claim_and_its_finish_with_and_without_speculation(slow_client, clock, speculate, claim_trips):
    """With speculation (a delivery) the claim is an insert sent beside the lookup; without (a
    waiting call's polls, which expect to find the lease) a lookup, then a transaction begun by
    its read.  Either way the finish is an update fenced on the claim's version."""
    client, counter = slow_client
    ledger = Ledger(clock)
    with client.context():
        description = RunDescription("scheduler", "invoice")
        claimed, trips = round_trips(
            counter, lambda: ledger.replay_or_claim("run", description, POLICY, speculate=speculate)
        )
        assert trips == claim_trips and claimed.attempt.fence is not None
        finished, trips = round_trips(counter, lambda: ledger.complete_run(claimed.attempt, {}, POLICY))
        assert isinstance(finished, Finished) and trips == 1


def test_an_overlap_forbid_run_costs_three_round_trips(slow_client, clock):
    """The claim reads the record and the job's lock (the Lookup begins the transaction) and
    commits both; the finish updates the record and deletes the lock, each fenced on the version
    the claim gave it, in one commit."""
    client, counter = slow_client
    ledger = Ledger(clock)
    exclusive = RunPolicy(600, 7200, exclusive=True)
    with client.context():
        description = RunDescription("scheduler", "invoice")
        claimed, trips = round_trips(counter, lambda: ledger.replay_or_claim("forbid", description, exclusive))
        assert trips == 2 and claimed.attempt.fence is not None and claimed.attempt.job_lock == "invoice"
        finished, trips = round_trips(counter, lambda: ledger.complete_run(claimed.attempt, {}, exclusive))
        assert isinstance(finished, Finished) and trips == 1
        assert JobLock.get_by_id("invoice") is None  # freed with the finish
        renewing = ledger.replay_or_claim("forbid-2", description, exclusive)
        renewed, trips = round_trips(counter, lambda: ledger.renew_lease(renewing.attempt, 600))
        # A renewal must still hold the lock to go on running: it reads both (Lookup; Commit).
        assert isinstance(renewed, Renewed) and trips == 2
        finished, trips = round_trips(counter, lambda: ledger.complete_run(renewing.attempt, {}, exclusive))
        assert isinstance(finished, Finished) and trips == 1  # fenced on the renewal's versions
        assert JobLock.get_by_id("invoice") is None
