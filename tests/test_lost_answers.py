"""A commit applied although Datastore reported an error: every write knows its own.

Without this, a claim whose answer was lost would find its own record on
the retry, see a live lease held by "someone else", and answer 409 for a whole
lease while nothing runs; a completion would be refused as stale.
"""

from __future__ import annotations

import grpc
import pytest

from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, InProgress, Released, Replayed
from devtools.rpc_counter import intercepted_client
from models import RunRecord, RunStatus
from tests.support.lost_answers import LostCommitAnswers

# The protocol holds on both of Google's emulators (tests/conftest.py).
pytestmark = pytest.mark.both_emulators

POLICY = RunPolicy(lease_seconds=60, retention_seconds=3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="j", scheduler_job_name="j")


@pytest.fixture(scope="module")
def lost_answers():
    return LostCommitAnswers()


@pytest.fixture
def ledger(datastore, lost_answers, clock):
    client = intercepted_client(datastore.project, lost_answers)
    with client.context():
        yield Ledger(clock)


# How a claim is made: in a transaction (claim_run), or as a delivery claims, by insert, its
# writes then fenced on versions.
HOW = ["claim_run", "by-version"]


def claim(ledger, how: str):
    if how == "by-version":
        return ledger.replay_or_claim("run-1", DESCRIPTION, POLICY)  # its fence, unless the claim was in doubt
    return ledger.claim_run("run-1", DESCRIPTION, POLICY)


@pytest.mark.parametrize("early", HOW)
@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN],
)
def test_a_claim_whose_answer_was_lost_is_still_this_attempts(ledger, lost_answers, code, early):
    before = lost_answers.lost
    lost_answers.lose_next_commits(1, code)
    outcome = claim(ledger, early)
    assert lost_answers.lost == before + 1
    assert isinstance(outcome, Claimed), outcome  # not a 409 against itself
    assert outcome.attempt.fence is None  # recognised, not written: no version to vouch for
    record = RunRecord.get_by_id("run-1")
    assert (record.attempt, record.attempt_id) == (1, outcome.attempt.attempt_id)
    assert len(record.attempts) == 1


@pytest.mark.parametrize("early", HOW)
@pytest.mark.parametrize("finish, status", [("complete_run", RunStatus.COMPLETED), ("fail_run", RunStatus.FAILED)])
def test_a_finish_whose_answer_was_lost_is_recorded_once(ledger, lost_answers, finish, status, early):
    claimed = claim(ledger, early)
    assert claimed.attempt.fence is not None  # a transaction's commit gives its version too
    lost_answers.lose_next_commits(1)
    outcome = getattr(ledger, finish)(claimed.attempt, {"n": 1}, POLICY)
    assert isinstance(outcome, Finished), outcome  # not refused as stale
    assert outcome.record.status == status
    assert isinstance(ledger.claim_run("run-1", DESCRIPTION, POLICY), Replayed)


@pytest.mark.parametrize("early", HOW)
def test_a_release_whose_answer_was_lost_is_released(ledger, lost_answers, early):
    claimed = claim(ledger, early)
    lost_answers.lose_next_commits(1)
    assert isinstance(ledger.release_run(claimed.attempt, {"message": "busy"}), Released)
    retried = ledger.claim_run("run-1", DESCRIPTION, POLICY)
    assert isinstance(retried, Claimed) and retried.attempt.number == 2


@pytest.mark.parametrize("finish", ["complete_run", "release_run"])
def test_a_finish_under_a_job_lock_whose_answer_was_lost_frees_the_lock(ledger, lost_answers, finish):
    """The finish's commit (the record, and the lock's delete) landed unseen: the transaction that
    settles the doubt recognises the finish and leaves the lock free, for the next execution."""
    from dedup.job_lock import JobLock

    exclusive = RunPolicy(lease_seconds=60, retention_seconds=3600, exclusive=True)
    claimed = ledger.claim_run("run-1", DESCRIPTION, exclusive)
    assert claimed.attempt.fence is not None and JobLock.get_by_id("j") is not None
    before = lost_answers.lost
    lost_answers.lose_next_commits(1)
    if finish == "complete_run":
        outcome = ledger.complete_run(claimed.attempt, {"n": 1}, exclusive)
        assert isinstance(outcome, Finished), outcome
    else:
        assert isinstance(ledger.release_run(claimed.attempt, {"message": "busy"}), Released)
    assert lost_answers.lost == before + 1
    assert JobLock.get_by_id("j") is None
    assert isinstance(ledger.claim_run("run-2", DESCRIPTION, exclusive), Claimed)


def test_a_finish_that_landed_without_its_locks_delete_frees_the_lock_when_settled(ledger, lost_answers):
    """The record's update landed and the lock's delete did not (here: fenced on a version the
    lock never had), and the answer was lost: the transaction that recognises the finish frees
    the lock, which is still this attempt's, instead of holding the job for the rest of a lease."""
    from dedup.job_lock import JobLock

    exclusive = RunPolicy(lease_seconds=60, retention_seconds=3600, exclusive=True)
    claimed = ledger.claim_run("run-1", DESCRIPTION, exclusive)
    claimed.attempt.fence.lock_version -= 1
    lost_answers.lose_next_commits(1)
    assert isinstance(ledger.complete_run(claimed.attempt, {"n": 1}, exclusive), Finished)
    assert JobLock.get_by_id("j") is None


def test_a_second_claim_is_still_refused(ledger, lost_answers):
    """Knowing its own landed commit does not let another claimer in."""
    lost_answers.lose_next_commits(1)
    first = ledger.claim_run("run-1", DESCRIPTION, POLICY)
    second = ledger.claim_run("run-1", DESCRIPTION, POLICY)
    assert isinstance(first, Claimed) and isinstance(second, InProgress)


def test_a_delivery_whose_commits_lose_their_answers_runs_the_job_once(datastore, lost_answers, jobs_file, clock):
    """Through the scheduler endpoint: the claim's and the completion's answers are both lost."""
    import webtest

    from handlers import create_app
    from tests import job_targets

    client = intercepted_client(datastore.project, lost_answers)
    app = webtest.TestApp(
        create_app(
            jobs_file=jobs_file("""
        jobs:
          invoice: {kind: python, target: "tests.job_targets:record", lease_seconds: 60}
    """),
            clock=clock,
            ndb_client=client,
        )
    )
    headers = {"X-CloudScheduler-JobName": "nightly", "X-CloudScheduler-ScheduleTime": "2025-10-17T23:50:00Z"}
    before = lost_answers.lost
    lost_answers.lose_next_commits(2)
    first = app.post("/jobs/invoice", headers=headers, status="*")
    assert lost_answers.lost == before + 2  # the claim's and the completion's
    assert first.status_code == 200 and first.json["status"] == "completed" and first.json["attempt"] == 1
    again = app.post("/jobs/invoice", headers=headers, status="*")
    assert again.status_code == 200 and again.json["duplicate"] is True
    assert len(job_targets.EFFECTS) == 1


def test_a_stale_release_whose_answer_was_lost_is_still_stale(ledger, lost_answers, clock, datastore_flavor):
    """Only a try that got as far as writing can have landed: a stale one stays stale."""
    from dedup.outcomes import Stale

    first = ledger.claim_run("run-1", DESCRIPTION, POLICY)
    clock.advance(61)
    second = ledger.claim_run("run-1", DESCRIPTION, POLICY)  # takes over
    assert isinstance(ledger.release_run(second.attempt, {"message": "busy"}), Released)
    before = lost_answers.lost
    lost_answers.lose_next_commits(1)  # the stale attempt's (read-only) commit
    assert isinstance(ledger.release_run(first.attempt, {"message": "late"}), Stale)
    # The fenced update is the commit lost; on the transactional path (the Firestore emulator) the
    # stale attempt's transaction reads, writes nothing and sends no commit at all.
    assert lost_answers.lost == before + (1 if datastore_flavor == "legacy" else 0)


def test_an_audit_pass_whose_mark_landed_but_whose_answer_was_lost_still_reports(ledger, lost_answers, clock):
    """The missed-execution audit recognises its own landed mark (it would never report those slots)."""
    from schedules.audit import audit
    from schedules.bound import BoundJob
    from schedules.config import SchedulerJob

    hourly = BoundJob(
        SchedulerJob(name="hourly", target="invoice", schedule="0 * * * *", project="acme-prod", location="us-central1")
    )
    assert audit(ledger, (hourly,)).reported == []  # a first pass sets the mark at now
    clock.advance(3 * 3600)
    lost_answers.lose_next_commits(1)
    missed = audit(ledger, (hourly,)).reported
    assert [m.slot.schedule_time.hour for m in missed] == [0, 1, 2]
    assert audit(ledger, (hourly,)).reported == []
