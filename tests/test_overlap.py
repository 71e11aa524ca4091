"""overlap: forbid: while an execution of a job holds a live lease, another execution of the
job gets 409 ExecutionOverlap and does not run.  The job's lock is claimed with the run in
one transaction, renewed with it, released with it, and never held past its lease."""

from __future__ import annotations

import datetime
import itertools
import threading

import pytest

from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, Overlap, Released, Renewed, Stale
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from models.job_lock import JobLock
from tests import job_targets
from tests.support.deliveries import scheduler_headers

LEASE = 60
EXCLUSIVE = RunPolicy(LEASE, 3600, exclusive=True)
JOBS = """
jobs:
  nightly:
    kind: python
    target: tests.job_targets:gated
    lease_seconds: 60
    overlap: forbid
  relaxed:
    kind: python
    target: tests.job_targets:gated
    lease_seconds: 60
"""


def description(job="nightly"):
    return RunDescription("scheduler", job, f"{job}-daily")


@pytest.fixture
def ledger(ndb_context, clock):
    return Ledger(clock)


def test_a_second_execution_waits_for_the_first_and_runs_after_it(ledger, clock):
    first = ledger.claim_run("slot-1", description(), EXCLUSIVE)
    assert isinstance(first, Claimed) and first.attempt.job_lock == "nightly"
    clock.advance(10)
    refused = ledger.claim_run("slot-2", description(), EXCLUSIVE)
    assert isinstance(refused, Overlap) and refused.holder_run_id == "slot-1" and refused.retry_after_seconds == 50
    assert ledger.lookup("slot-2") is None  # nothing written for it
    assert isinstance(ledger.renew_lease(first.attempt, LEASE), Renewed)
    assert JobLock.get_by_id("nightly").lease_expires == ledger.lookup("slot-1").lease_expires  # renewed together
    assert isinstance(ledger.complete_run(first.attempt, {"ok": 1}, EXCLUSIVE), Finished)
    assert JobLock.get_by_id("nightly") is None  # released with the finish
    assert isinstance(ledger.claim_run("slot-2", description(), EXCLUSIVE), Claimed)


def test_a_release_frees_the_job_too(ledger):
    first = ledger.claim_run("slot-1", description(), EXCLUSIVE)
    assert isinstance(ledger.release_run(first.attempt, {"message": "busy"}), Released)
    assert isinstance(ledger.claim_run("slot-2", description(), EXCLUSIVE), Claimed)


def test_a_crashed_attempt_never_holds_the_job_past_its_lease(ledger, clock):
    crashed = ledger.claim_run("slot-1", description(), EXCLUSIVE)
    clock.advance(LEASE)  # a lease ends at the instant it names
    second = ledger.claim_run("slot-2", description(), EXCLUSIVE)
    assert isinstance(second, Claimed)
    # The crashed attempt, back too late, has lost the job: it may not go on running.
    assert isinstance(ledger.renew_lease(crashed.attempt, LEASE), Stale)
    assert isinstance(ledger.record_downstream(crashed.attempt, "late"), Stale)
    assert JobLock.get_by_id("nightly").run_id == "slot-2"
    # Its finish is still recorded (the work happened), and leaves the new holder's lock alone.
    assert isinstance(ledger.complete_run(crashed.attempt, {"late": True}, EXCLUSIVE), Finished)
    assert JobLock.get_by_id("nightly").run_id == "slot-2"


def test_a_takeover_of_the_same_execution_takes_its_lock(ledger, clock):
    ledger.claim_run("slot-1", description(), EXCLUSIVE)
    clock.advance(LEASE)
    taken = ledger.claim_run("slot-1", description(), EXCLUSIVE)
    assert isinstance(taken, Claimed) and taken.attempt.number == 2
    assert JobLock.get_by_id("nightly").attempt_id == taken.attempt.attempt_id


def test_jobs_that_allow_overlap_and_other_jobs_are_not_held(ledger):
    ledger.claim_run("slot-1", description(), EXCLUSIVE)
    assert isinstance(ledger.claim_run("other-1", description("other"), EXCLUSIVE), Claimed)
    allow = RunPolicy(LEASE, 3600)
    ledger.claim_run("r-1", description("relaxed"), allow)
    assert isinstance(ledger.claim_run("r-2", description("relaxed"), allow), Claimed)


def test_a_delivery_of_another_execution_is_409_execution_overlap(make_client, clock):
    client = make_client(JOBS)
    results = []
    gate = "overlap-1"
    first = threading.Thread(
        target=lambda: results.append(
            client.post("/jobs/nightly", gate.encode(), headers=scheduler_headers(scheduler_job_name="nightly-daily"))
        )
    )
    first.start()
    job_targets.STARTED.setdefault(gate, threading.Event()).wait(10)
    other = scheduler_headers(scheduler_job_name="nightly-daily", schedule_time="2025-10-18T23:50:00Z")
    refused = client.post("/jobs/nightly", b"other", headers=other, status=409)
    assert refused.json["error"] == "ExecutionOverlap" and int(refused.headers["Retry-After"]) >= 1
    assert "other" not in job_targets.STARTED
    job_targets.GATES.setdefault(gate, threading.Event()).set()
    first.join(10)
    assert results[0].status_int == 200
    job_targets.GATES.setdefault("other", threading.Event()).set()
    assert client.post("/jobs/nightly", b"other", headers=other, status=200).json["status"] == "completed"


@pytest.mark.parametrize("value", ["sometimes", "Forbid", True, 1])
def test_overlap_is_allow_or_forbid(value):
    with pytest.raises(JobsConfigError, match="overlap"):
        parse_jobs(f"jobs:\n  j:\n    kind: python\n    target: tests.job_targets:record\n    overlap: {value}\n")


# -- every ordering of two executions of one forbid job -----------------------------------------

STEPS = {"A": ("claim", "renew", "complete"), "B": ("claim", "renew", "complete"), "clock": ("tick", "tick")}


def orderings():
    """Every interleaving of the actors' steps, each actor's steps in its order."""
    names = [name for name, steps in STEPS.items() for _ in steps]
    yield from set(itertools.permutations(names))


@pytest.mark.exhaustive
def test_every_ordering_of_two_executions_never_runs_both_and_never_blocks_one(datastore, ndb_client, clock):
    """Never two live leases on the job at once; and once every lease is over, the unfinished
    executions run one after the other (nothing is blocked past a lease)."""
    lease = datetime.timedelta(seconds=LEASE)
    played = 0
    with ndb_client.context():
        for order in sorted(orderings()):
            datastore.reset()
            ledger, start = Ledger(clock), clock.now()
            held, live_until, done, gone = {}, {}, set(), set()
            owner = None  # who holds the job's lock, as the protocol should have it
            position = dict.fromkeys(STEPS, 0)
            for actor in order:
                step = STEPS[actor][position[actor]]
                position[actor] += 1
                if actor == "clock":
                    clock.advance(LEASE)
                    continue
                if actor in gone:
                    continue  # refused: this delivery went away
                now = clock.now()
                where = (order, actor, step)
                if step == "claim":
                    outcome = ledger.claim_run(f"slot-{actor}", description(), EXCLUSIVE)
                    if any(a != actor and until > now for a, until in live_until.items()):
                        assert isinstance(outcome, Overlap), (where, outcome)
                        gone.add(actor)
                        continue
                    assert isinstance(outcome, Claimed), (where, outcome)
                    held[actor], live_until[actor], owner = outcome.attempt, now + lease, actor
                elif step == "renew":
                    outcome = ledger.renew_lease(held[actor], LEASE)
                    if owner == actor:
                        assert isinstance(outcome, Renewed), (where, outcome)
                        live_until[actor] = now + lease
                    else:  # its lease ran out and the other execution took the job: it must stop
                        assert isinstance(outcome, Stale), (where, outcome)
                        live_until.pop(actor, None)
                else:
                    assert isinstance(ledger.complete_run(held[actor], {"by": actor}, EXCLUSIVE), Finished), where
                    live_until.pop(actor, None)
                    done.add(actor)
                    owner = None if owner == actor else owner
                assert sum(until > clock.now() for until in live_until.values()) <= 1, (where, live_until)
                played += 1
            clock.advance(LEASE)  # every lease is over
            unfinished = [a for a in ("A", "B") if a not in done]
            if unfinished:
                first = ledger.claim_run(f"slot-{unfinished[0]}", description(), EXCLUSIVE)
                assert isinstance(first, Claimed), (order, first)
                for later in unfinished[1:]:
                    assert isinstance(ledger.claim_run(f"slot-{later}", description(), EXCLUSIVE), Overlap), order
                    ledger.complete_run(first.attempt, {}, EXCLUSIVE)
                    assert isinstance(ledger.claim_run(f"slot-{later}", description(), EXCLUSIVE), Claimed), order
            clock.advance((start - clock.now()).total_seconds())
    assert played > 100
