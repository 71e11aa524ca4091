"""overlap: forbid: while an execution of a job holds a live lease, another execution of the
job gets 409 ExecutionOverlap and does not run.  The job's lock is claimed with the run in
one transaction, renewed with it, released with it, and never held past its lease."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import threading

import pytest

from dedup.finished_cache import FinishedRuns
from dedup.job_lock import JobLock
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, InProgress, Overlap, Released, Renewed, Replayed, Stale
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from tests import job_targets
from tests.support.deliveries import scheduler_headers

# The protocol holds on both of Google's emulators (tests/conftest.py).
pytestmark = pytest.mark.both_emulators

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


# -- every ordering of executions of one forbid job -----------------------------------------

# Each actor is a delivery of an execution (its slot) and its steps.  Two slots that each
# renew and complete; and two deliveries of one slot (a takeover, after a release or a lost
# lease) against another slot.  A clock tick is exactly one lease.
SCENARIOS = {
    "two executions": {
        "A": ("A", ("claim", "renew", "complete")),
        "B": ("B", ("claim", "renew", "complete")),
        "clock": (None, ("tick", "tick")),
    },
    "a takeover beside another execution": {
        "A": ("A", ("claim", "release")),
        "A2": ("A", ("claim", "complete")),
        "B": ("B", ("claim", "complete")),
        "clock": (None, ("tick",)),
    },
}


def orderings(actors):
    """Every interleaving of the actors' steps, each actor's steps in its order."""
    names = [name for name, (_, steps) in actors.items() for _ in steps]
    yield from set(itertools.permutations(names))


@dataclasses.dataclass
class Protocol:
    """What overlap: forbid should have done, independent of the ledger's code."""

    now: datetime.datetime
    status: dict = dataclasses.field(default_factory=dict)  # slot -> "in_progress", "released", "completed"
    owner: dict = dataclasses.field(default_factory=dict)  # slot -> the actor whose attempt it is
    lease_until: dict = dataclasses.field(default_factory=dict)  # actor -> the end of its lease
    holder: str | None = None  # the actor whose attempt holds the job's lock
    lock_until: datetime.datetime | None = None

    def claim(self, actor, slot, lease):
        """The outcome class a claim gets; a Claimed one changes the model."""
        owner = self.owner.get(slot)
        if self.status.get(slot) == "completed":
            return Replayed
        if self.status.get(slot) == "in_progress" and self.lease_until[owner] > self.now:
            return InProgress
        if self.holder is not None and self.slot_of[self.holder] != slot and self.lock_until > self.now:
            return Overlap
        self.status[slot], self.owner[slot], self.lease_until[actor] = "in_progress", actor, self.now + lease
        self.holder, self.lock_until = actor, self.now + lease
        return Claimed

    def renew(self, actor, slot, lease):
        if self.owner.get(slot) != actor or self.status[slot] != "in_progress" or self.holder != actor:
            return Stale  # taken over, or another execution took the job: it must stop
        self.lease_until[actor] = self.lock_until = self.now + lease
        return Renewed

    def finish(self, actor, slot, step):
        if self.owner.get(slot) != actor or self.status[slot] != "in_progress":
            return Stale
        self.status[slot] = {"complete": "completed", "release": "released"}[step]
        self.lease_until.pop(actor, None)
        if self.holder == actor:  # freed at once: the next execution may start
            self.holder = self.lock_until = None
        return Finished if step == "complete" else Released


@pytest.mark.exhaustive
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_ordering_never_runs_two_executions_and_frees_the_job_with_each_finish(
    datastore, ndb_client, clock, scenario
):
    """Each step's outcome, each record's status and the stored lock are what the model says: a
    claim under another execution's live lock is refused, a renewal without the lock is Stale, a
    finish frees the lock at once if it is still its own (and leaves another's alone), so never
    two live leases on the job at once; and once every lease is over, the unfinished executions
    run one after the other (nothing is blocked past a lease)."""
    actors = SCENARIOS[scenario]
    lease = datetime.timedelta(seconds=LEASE)
    played = 0
    with ndb_client.context():
        for order in sorted(orderings(actors)):
            datastore.reset()
            ledger, start = Ledger(clock, FinishedRuns(0)), clock.now()
            model = Protocol(clock.now())
            model.slot_of = {actor: slot for actor, (slot, _) in actors.items()}
            held, gone = {}, set()
            position = dict.fromkeys(actors, 0)
            for actor in order:
                slot, steps = actors[actor]
                step = steps[position[actor]]
                position[actor] += 1
                if actor == "clock":
                    clock.advance(LEASE)
                    model.now = clock.now()
                    continue
                if actor in gone:
                    continue  # refused or finished: this delivery went away
                where = (order, actor, step)
                if step == "claim":
                    outcome = ledger.claim_run(f"slot-{slot}", description(), EXCLUSIVE)
                    assert isinstance(outcome, model.claim(actor, slot, lease)), (where, outcome)
                    if isinstance(outcome, Claimed):
                        held[actor] = outcome.attempt
                    else:
                        gone.add(actor)
                elif step == "renew":
                    outcome = ledger.renew_lease(held[actor], LEASE)
                    assert isinstance(outcome, model.renew(actor, slot, lease)), (where, outcome)
                else:
                    finish = ledger.complete_run if step == "complete" else ledger.release_run
                    document = {"by": actor} if step == "complete" else {"message": actor}
                    outcome = (
                        finish(held[actor], document, EXCLUSIVE)
                        if step == "complete"
                        else finish(held[actor], document)
                    )
                    assert isinstance(outcome, model.finish(actor, slot, step)), (where, outcome)
                for each, status in model.status.items():
                    assert ledger.lookup(f"slot-{each}").status == status, (where, each)
                lock = JobLock.get_by_id("nightly")
                expected = held[model.holder].attempt_id if model.holder else None
                assert (lock.attempt_id if lock else None) == expected, (where, lock)
                live = [a for a, until in model.lease_until.items() if until > clock.now()]
                assert len(live) <= 1, (where, live)
                played += 1
            clock.advance(LEASE)  # every lease is over
            unfinished = sorted(
                {slot for slot, _ in actors.values() if slot}
                - {s for s, status in model.status.items() if status == "completed"}
            )
            if unfinished:
                first = ledger.claim_run(f"slot-{unfinished[0]}", description(), EXCLUSIVE)
                assert isinstance(first, Claimed), (order, first)
                for later in unfinished[1:]:
                    assert isinstance(ledger.claim_run(f"slot-{later}", description(), EXCLUSIVE), Overlap), order
                    ledger.complete_run(first.attempt, {}, EXCLUSIVE)
                    assert isinstance(ledger.claim_run(f"slot-{later}", description(), EXCLUSIVE), Claimed), order
            clock.advance((start - clock.now()).total_seconds())
    assert played > 100
