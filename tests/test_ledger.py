"""The ledger on its own: fencing, leases and expiry, stepped with a manual clock."""

from __future__ import annotations

import datetime

import pytest

from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, InProgress, Released, Renewed, Replayed, Stale
from models import RunRecord, RunStatus

# The protocol holds on both of Google's emulators (tests/conftest.py).
pytestmark = pytest.mark.both_emulators

POLICY = RunPolicy(lease_seconds=60, retention_seconds=3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="invoice", scheduler_job_name="nightly")


@pytest.fixture
def ledger(ndb_context, clock):
    return Ledger(clock)


def claim(ledger, run_id="run-1") -> Claimed:
    outcome = ledger.claim_run(run_id, DESCRIPTION, POLICY)
    assert isinstance(outcome, Claimed), outcome
    return outcome


def test_a_claim_writes_an_in_progress_record_with_lease_and_expiry(ledger, clock):
    outcome = claim(ledger)
    record = RunRecord.get_by_id("run-1")
    assert record.status == RunStatus.IN_PROGRESS
    assert record.attempt == 1 and record.attempt_id == outcome.attempt.attempt_id
    assert record.lease_expires == clock.now() + datetime.timedelta(seconds=60)
    assert record.expire_at == clock.now() + datetime.timedelta(seconds=3600)
    assert record.created == record.updated == clock.now()


def test_a_live_lease_refuses_a_second_claim(ledger, clock):
    claim(ledger)
    clock.advance(59.5)
    outcome = ledger.claim_run("run-1", DESCRIPTION, POLICY)
    assert isinstance(outcome, InProgress)
    assert outcome.retry_after_seconds == 1


def test_takeover_raises_the_attempt_and_fences_the_old_one_out(ledger, clock):
    first = claim(ledger)
    clock.advance(60)  # the lease ends exactly now
    second = claim(ledger)
    assert second.attempt.number == 2
    assert second.attempt.attempt_id != first.attempt.attempt_id
    before = RunRecord.get_by_id("run-1").to_dict()
    for stale_write in (
        lambda: ledger.complete_run(first.attempt, {"late": True}, POLICY),
        lambda: ledger.fail_run(first.attempt, {"message": "late"}, POLICY),
        lambda: ledger.release_run(first.attempt, {"message": "late"}),
        lambda: ledger.renew_lease(first.attempt, 600),
    ):
        outcome = stale_write()
        assert isinstance(outcome, Stale)
        assert outcome.current.attempt == 2
    assert RunRecord.get_by_id("run-1").to_dict() == before


def test_completion_is_accepted_after_the_lease_if_nobody_took_over(ledger, clock):
    first = claim(ledger)
    clock.advance(3000)
    outcome = ledger.complete_run(first.attempt, 0, POLICY)
    assert isinstance(outcome, Finished)
    record = RunRecord.get_by_id("run-1")
    assert record.status == RunStatus.COMPLETED and record.result == 0
    # Retention restarts from the finish.
    assert record.expire_at == clock.now() + datetime.timedelta(seconds=3600)


def test_a_finished_run_is_terminal(ledger, clock):
    first = claim(ledger)
    ledger.complete_run(first.attempt, {"n": 1}, POLICY)
    assert isinstance(ledger.claim_run("run-1", DESCRIPTION, POLICY), Replayed)
    assert isinstance(ledger.complete_run(first.attempt, {"n": 2}, POLICY), Stale)
    assert isinstance(ledger.release_run(first.attempt, {}), Stale)
    assert isinstance(ledger.fail_run(first.attempt, {"n": 3}, POLICY), Stale)
    before = RunRecord.get_by_id("run-1").to_dict()
    # The attempt's own late heartbeat or downstream note, landing after its completion.
    assert isinstance(ledger.renew_lease(first.attempt, 60), Stale)
    assert isinstance(ledger.record_downstream(first.attempt, "late"), Stale)
    assert RunRecord.get_by_id("run-1").to_dict() == before
    assert before["result"] == {"n": 1} and before["status"] == RunStatus.COMPLETED


def test_release_keeps_the_record_and_the_retry_continues_it(ledger, clock):
    first = claim(ledger)
    ledger.record_downstream(first.attempt, "executions/e1")
    clock.advance(5)
    released = ledger.release_run(first.attempt, {"message": "busy"})
    assert isinstance(released, Released) and released.record.status == RunStatus.RELEASED
    kept = RunRecord.get_by_id("run-1")
    assert kept.status == RunStatus.RELEASED and kept.error == {"message": "busy"}
    assert kept.lease_expires == clock.now() and kept.finished == clock.now()
    assert [(a["attempt"], a["outcome"]) for a in kept.attempts] == [(1, "released")]
    assert ledger.refusal("run-1", DESCRIPTION) is None  # nothing to replay: the retry runs
    retry = claim(ledger)
    assert isinstance(retry, Claimed) and retry.attempt.number == 2  # the attempt numbers go on
    assert retry.attempt.downstream == "executions/e1"  # what the released attempt started, to adopt
    record = RunRecord.get_by_id("run-1")
    assert [(a["attempt"], a["outcome"]) for a in record.attempts] == [(1, "released"), (2, None)]
    assert record.status == RunStatus.IN_PROGRESS and record.error is None and record.finished is None
    assert isinstance(ledger.renew_lease(first.attempt, 60), Stale)  # the released attempt is fenced out
    assert isinstance(ledger.release_run(first.attempt, {}), Stale)


def test_renewal_extends_the_lease_of_the_owner(ledger, clock):
    first = claim(ledger)
    clock.advance(50)
    assert isinstance(ledger.renew_lease(first.attempt, 60), Renewed)
    clock.advance(50)  # 100 s after the claim, 50 s after renewal
    assert isinstance(ledger.claim_run("run-1", DESCRIPTION, POLICY), InProgress)


def test_an_expired_record_counts_as_absent_before_ttl_deletes_it(ledger, clock):
    first = claim(ledger)
    ledger.complete_run(first.attempt, {"n": 1}, POLICY)
    clock.advance(3601)
    assert ledger.refusal("run-1", DESCRIPTION) is None
    again = claim(ledger)
    # The attempt number keeps rising, so it stays a valid fencing token.
    assert again.attempt.number == 2
    assert RunRecord.get_by_id("run-1").created == clock.now()


def test_the_record_refuses_a_claim_only_while_leased_or_once_finished(ledger, clock):
    assert ledger.refusal("run-1", DESCRIPTION) is None
    first = claim(ledger)
    assert isinstance(ledger.refusal("run-1", DESCRIPTION), InProgress)  # a live lease: 409, no transaction
    clock.advance(POLICY.lease_seconds + 1)
    assert ledger.refusal("run-1", DESCRIPTION) is None  # the lease ran out: a claim takes it over
    clock.advance(-(POLICY.lease_seconds + 1))
    ledger.fail_run(first.attempt, {"message": "rejected"}, POLICY)
    replay = ledger.refusal("run-1", DESCRIPTION)
    assert isinstance(replay, Replayed) and replay.record.error == {"message": "rejected"}
    # An operator's run replaces the failure it saw, and only that one: a repeat of it, which saw
    # an attempt the record has moved past, is answered from the record.
    assert ledger.refusal("run-1", DESCRIPTION, reopen_attempt=1) is None
    assert isinstance(ledger.refusal("run-1", DESCRIPTION, reopen_attempt=0), Replayed)
    assert isinstance(ledger.refusal("run-1", DESCRIPTION, reopen_attempt=2), Replayed)


def test_only_aborted_transactions_count_as_contention():
    from google.api_core import exceptions as api_exceptions

    from dedup.transactions import is_contention

    assert is_contention(api_exceptions.Aborted("too much contention"))
    assert is_contention(api_exceptions.RetryError("gave up", cause=api_exceptions.Aborted("x")))
    assert not is_contention(api_exceptions.RetryError("gave up", cause=api_exceptions.ServiceUnavailable("down")))


def test_error_documents_are_always_storable():
    from dedup.runner import error_document, storable_json_problem

    circular: dict = {}
    circular["self"] = circular
    for details in (circular, {"n": float("nan")}, {"when": datetime.datetime(2030, 1, 1)}, "x" * 10**6):
        document = error_document(RuntimeError("boom " * 10000), details=details)
        assert storable_json_problem(document) is None
        assert len(document["message"]) <= 4096


def test_a_record_never_expires_while_its_lease_is_live(ledger, clock):
    long_lease = RunPolicy(lease_seconds=600, retention_seconds=1000)
    claim_first = ledger.claim_run("run-1", DESCRIPTION, long_lease)
    clock.advance(900)  # lease over; retention ends in 100 s
    takeover = ledger.claim_run("run-1", DESCRIPTION, long_lease)
    assert isinstance(takeover, Claimed) and takeover.attempt.number == 2
    record = RunRecord.get_by_id("run-1")
    assert record.expire_at >= record.lease_expires
    clock.advance(200)  # past created + retention, inside attempt 2's lease
    assert isinstance(ledger.claim_run("run-1", DESCRIPTION, long_lease), InProgress)
    ledger.renew_lease(takeover.attempt, 3000)
    assert RunRecord.get_by_id("run-1").expire_at >= RunRecord.get_by_id("run-1").lease_expires
    assert isinstance(claim_first, Claimed)


def test_contended_transactions_are_tried_again(ndb_context):
    from google.api_core import exceptions as api_exceptions

    from dedup.record_store import RecordStore
    from dedup.transactions import transact

    failures = iter([api_exceptions.Aborted("contention")] * 3)

    def write(transaction):
        error = next(failures, None)
        if error:
            raise error
        record = RunRecord(
            id="x",
            source="scheduler",
            job_id="j",
            status="completed",
            attempt_id="a",
            attempt=1,
            lease_expires=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
            expire_at=datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC),
            created=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
            updated=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
        )
        transaction.put(record)
        return "written"

    assert transact(write, 10, RecordStore.of_context())[0] == "written"
    assert RunRecord.get_by_id("x").status == "completed"
    always = iter(lambda: api_exceptions.Aborted("contention"), None)
    with pytest.raises(api_exceptions.Aborted):
        transact(lambda transaction: (_ for _ in ()).throw(next(always)), 0.3, RecordStore.of_context())


def test_attempt_history_is_kept_in_the_existing_transactions(ledger, clock):
    first = claim(ledger)
    clock.advance(61)
    second = claim(ledger)
    clock.advance(5)
    ledger.complete_run(second.attempt, {"ok": True}, POLICY)
    history = RunRecord.get_by_id("run-1").attempts
    assert [(h["attempt"], h["outcome"]) for h in history] == [(1, "lease_expired"), (2, "completed")]
    assert history[0]["attempt_id"] == first.attempt.attempt_id and history[0]["finished"] is None
    assert history[1]["started"] == "2030-01-01T00:01:01.000000Z"  # spelled as every timestamp of the API
    assert history[1]["finished"] == "2030-01-01T00:01:06.000000Z"
    assert history[1]["instance"]


def test_attempt_history_is_bounded(ledger, clock):
    from dedup.claims import MAX_ATTEMPT_HISTORY

    for _ in range(MAX_ATTEMPT_HISTORY + 5):
        claim(ledger)
        clock.advance(61)
    history = RunRecord.get_by_id("run-1").attempts
    assert len(history) == MAX_ATTEMPT_HISTORY
    assert history[-1]["attempt"] == MAX_ATTEMPT_HISTORY + 5


def test_a_heartbeat_that_finds_the_run_taken_over_says_so(ledger, clock):
    from dedup.heartbeat import LeaseHeartbeat

    first = claim(ledger)
    clock.advance(61)
    claim(ledger)  # attempt 2 takes over while attempt 1 still runs
    with LeaseHeartbeat(ledger, first.attempt, lease_seconds=0.3, max_run_seconds=None) as heartbeat:
        assert heartbeat.wait_until_taken_over(10)
        assert heartbeat.lease_lost()
    record = RunRecord.get_by_id("run-1")
    assert record.attempt == 2 and record.attempt_id != first.attempt.attempt_id


@pytest.mark.slow
def test_renewals_stop_after_max_run_seconds_and_the_job_is_told(ndb_context):
    import time

    from dedup.clock import SystemClock
    from dedup.heartbeat import LeaseHeartbeat

    real = Ledger(SystemClock())
    policy = RunPolicy(lease_seconds=1.5, retention_seconds=3600)
    first = real.claim_run("run-hb", DESCRIPTION, policy)
    with LeaseHeartbeat(real, first.attempt, lease_seconds=1.5, max_run_seconds=4) as heartbeat:
        time.sleep(2.5)  # renewed every 0.5 s: live a second past the first lease
        assert isinstance(real.claim_run("run-hb", DESCRIPTION, policy), InProgress)
        assert not heartbeat.lease_lost()
        time.sleep(2.5)  # renewals stop at 4 s and the last one ends the lease there
        assert heartbeat.lease_lost()  # the job is told before anyone takes over
        taken = real.claim_run("run-hb", DESCRIPTION, policy)
    assert isinstance(taken, Claimed) and taken.attempt.number == 2


def test_without_renewals_the_job_is_told_when_its_claimed_lease_runs_out(ledger):
    import time

    from dedup.heartbeat import LeaseHeartbeat

    first = claim(ledger)
    with LeaseHeartbeat(ledger, first.attempt, lease_seconds=0.5, max_run_seconds=None, renew=False) as heartbeat:
        assert not heartbeat.lease_lost()
        time.sleep(0.6)
        assert heartbeat.lease_lost()
        assert heartbeat.renewed == 0  # nothing renews


@pytest.mark.slow
def test_a_heartbeat_that_cannot_reach_datastore_says_the_lease_ran_out(ledger):
    import time

    from dedup.heartbeat import LeaseHeartbeat

    class Unreachable(Ledger):
        def renew_lease(self, attempt, lease_seconds, patience_seconds=None):
            from google.api_core import exceptions

            raise exceptions.ServiceUnavailable("Datastore is away")

    first = claim(ledger)
    with LeaseHeartbeat(Unreachable(ledger.clock), first.attempt, lease_seconds=0.9, max_run_seconds=None) as heartbeat:
        time.sleep(0.4)
        assert not heartbeat.lease_lost()  # renewals failing, but the claimed lease still holds
        time.sleep(0.8)
        assert heartbeat.lease_lost()


@pytest.mark.slow
def test_the_runner_tells_the_job_when_its_lease_runs_out(ndb_context):
    """``attempt.lease_lost()`` (``context.lease_lost()`` for job kinds) is wired through run_once."""
    import time

    from dedup.clock import SystemClock
    from dedup.runner import run_once

    real = Ledger(SystemClock())

    def slow_job(attempt):
        before = attempt.lease_lost()
        time.sleep(2.6)
        return {"before": before, "after": attempt.lease_lost()}

    # A 2 s lease: run out at 2.6 s without renewals; renewed every 2/3 s it
    # ends at 3.3 s or later once any renewal after the first has landed.
    unrenewed = RunPolicy(lease_seconds=2, retention_seconds=3600, heartbeat=False)
    renewed = RunPolicy(lease_seconds=2, retention_seconds=3600, heartbeat=True)
    assert run_once(real, "run-unrenewed", DESCRIPTION, unrenewed, slow_job).record.result == {
        "before": False,
        "after": True,
    }
    assert run_once(real, "run-renewed", DESCRIPTION, renewed, slow_job).record.result == {
        "before": False,
        "after": False,
    }


def test_jobs_get_heartbeats_by_default(jobs_file):
    from jobs.config import load_jobs

    jobs = load_jobs(
        jobs_file("""
        jobs:
          a: {kind: python, target: tests.job_targets:record}
          b: {kind: python, target: tests.job_targets:record, heartbeat: false, max_run_seconds: 7200}
    """)
    )
    assert jobs["a"].policy.heartbeat is True and jobs["a"].policy.max_run_seconds == 600
    assert jobs["b"].policy.heartbeat is False and jobs["b"].policy.max_run_seconds == 7200


def test_every_running_attempt_is_renewed_by_the_same_few_threads(datastore, ndb_client, clock):
    """Issue 26 §4: a thread per run cost about 3 ms of CPU each; a process keeps one scheduler
    and RENEWAL_WORKERS workers, however many attempts run."""
    import time

    from dedup.heartbeat import RENEWAL_WORKERS, LeaseHeartbeat, Renewals

    with ndb_client.context():
        ledger = Ledger(clock)
        attempts = [ledger.replay_or_claim(f"many-{i}", DESCRIPTION, POLICY).attempt for i in range(12)]
        beats = [LeaseHeartbeat(ledger, attempt, lease_seconds=0.3, max_run_seconds=None) for attempt in attempts]
        for beat in beats:
            beat.__enter__()
        deadline = time.monotonic() + 10
        while min(beat.renewed for beat in beats) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        threads = Renewals.threads()
        for beat in beats:
            beat.__exit__(None, None, None)
    assert min(beat.renewed for beat in beats) >= 2  # each renewed again and again
    assert 1 <= threads <= 1 + RENEWAL_WORKERS


def test_a_finished_run_leaves_nothing_in_the_renewal_queue(datastore, ndb_client, clock):
    """Issue 37 §2: each finished run's heartbeat stayed queued for a third of its lease, so a
    worker's memory grew with its run rate (90 to 205 MiB over 30k runs).  Now the run's exit
    takes its next renewal out of the queue, and nothing keeps the heartbeat, its attempt or its
    record: after a dozen runs with hour-long leases, none is left, and the queue is empty."""
    import gc
    import weakref

    from dedup.heartbeat import RENEWALS, LeaseHeartbeat
    from dedup.runner import run_once

    hour = RunPolicy(lease_seconds=3600, retention_seconds=7200, heartbeat=True)
    seen: list[weakref.ref[object]] = []

    def work(attempt):
        seen.append(weakref.ref(attempt))
        return {"ran": True}

    with ndb_client.context():
        ledger = Ledger(clock)
        before = RENEWALS.pending()
        for n in range(12):
            assert run_once(ledger, f"renewed-{n}", DESCRIPTION, hour, work).record.result == {"ran": True}
        assert RENEWALS.pending() == before == 0
    gc.collect()
    assert [ref for ref in seen if ref() is not None] == []  # every attempt (and so its heartbeat) freed
    kept = [o for o in gc.get_objects() if isinstance(o, LeaseHeartbeat) and o.attempt.run_id.startswith("renewed-")]
    assert kept == []


def test_a_heartbeat_stopped_while_its_renewal_is_in_flight_is_not_queued_again():
    import threading
    import time

    from dedup.heartbeat import LeaseHeartbeat, Renewals

    renewals = Renewals(workers=1, name="queue-test-renewal")  # not counted as the process's own
    beat = LeaseHeartbeat.__new__(LeaseHeartbeat)  # no ledger needed: only its stop is read
    beat._stopped = threading.Event()
    renewals.schedule(beat, float("inf"))
    assert renewals.pending() == 1
    renewals.cancel(beat)
    assert renewals.pending() == 0
    beat._stopped.set()
    renewals.schedule(beat, float("inf"))  # a renewal that ends after the run did
    assert renewals.pending() == 0
    # A renewal due past the clock's range (waited for as an hour at most) leaves the thread running.
    beat._stopped.clear()
    renewals.schedule(beat, float("inf"))
    time.sleep(0.2)
    assert renewals._thread is not None and renewals._thread.is_alive()
    renewals.cancel(beat)
