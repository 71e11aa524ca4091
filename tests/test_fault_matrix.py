"""Every Datastore error, at every call of a delivery, on both emulators: the job runs at most once
per attempt that held the lease, the record ends true, no lease is left that nobody holds, and
the answer is the documented one (docs/contract.md, "What happens to a delivery").

Errors are injected by a gRPC interceptor (the pattern of tests/support/lost_answers.py), once,
at one call: the claim's lookup, the claim's commit, a renewal's commit, the finish's commit,
with and without ``overlap: forbid``.  The codes production documents and no emulator produces
(RESOURCE_EXHAUSTED), a record deleted since it was read (NOT_FOUND), a stale version refused as
a whole-commit error (FAILED_PRECONDITION, INVALID_ARGUMENT): not sent, so not applied.  The
codes in doubt (UNAVAILABLE, DEADLINE_EXCEEDED): sent and applied, the answer lost, the worse
case of the two.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from flask import Flask
from google.cloud.datastore_v1.types.datastore import CommitRequest

from dedup.job_lock import JobLock
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Finished, Renewed
from dedup.runner import run_once
from devtools.rpc_counter import intercepted_client
from handlers.answers import outcome_response
from models import RunRecord, RunStatus
from tests.conftest import ndb_client_of
from tests.support.lost_answers import FailedCall

pytestmark = pytest.mark.both_emulators

NOT_APPLIED = [
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
]
IN_DOUBT = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
SITES = {
    "claim lookup": ("claim", "/Lookup"),
    "claim commit": ("claim", "/Commit"),
    "renewal": ("renewal", "/Commit"),
    "finish": ("finish", "/Commit"),
}
DESCRIPTION = RunDescription(source="scheduler", job_id="nightly", scheduler_job_name="nightly")


class OneFault(grpc.UnaryUnaryClientInterceptor):
    """Fails the first call of ``method`` made while the delivery is in ``phase``."""

    def __init__(self, phase: str, method: str, code: grpc.StatusCode) -> None:
        self.armed, self.method, self.code = phase, method, code
        self.phase = "claim"
        self.injected = 0
        self._lock = threading.Lock()

    def intercept_unary_unary(self, continuation, details, request):
        with self._lock:
            hit = not self.injected and self.phase == self.armed and details.method.endswith(self.method)
            if hit:
                self.injected += 1
        if not hit:
            return continuation(details, request)
        if self.code in IN_DOUBT:
            continuation(details, request).result()  # it lands; its answer is lost
        elif details.method.endswith("/Commit"):
            # Refused: nothing written, and the transaction over, as after any failed commit
            # (sent with no mutations, so a pessimistic database frees its reads' locks).
            empty = CommitRequest.pb(CommitRequest(request))
            del empty.mutations[:]
            continuation(details, CommitRequest.wrap(empty)).result()
        return FailedCall(self.code, f"injected at the {self.armed}")


@pytest.mark.sample(12)  # make check: a spread of the 96; make test: every one
@pytest.mark.parametrize("exclusive", [False, True], ids=["overlap allow", "overlap forbid"])
@pytest.mark.parametrize("site", list(SITES))
@pytest.mark.parametrize("code", NOT_APPLIED + IN_DOUBT, ids=lambda code: code.name)
def test_one_fault_anywhere_still_runs_once_and_ends_true(datastore, clock, code, site, exclusive):
    phase, method = SITES[site]
    fault = OneFault(phase, method, code)
    policy = RunPolicy(lease_seconds=60, retention_seconds=3600, exclusive=exclusive)
    ledger = Ledger(clock)
    runs: list[int] = []

    def work(attempt):
        runs.append(attempt.number)
        fault.phase = "renewal"
        assert isinstance(ledger.renew_lease(attempt, 60), Renewed)  # it still holds the run
        fault.phase = "finish"
        return {"ran": len(runs)}

    with intercepted_client(datastore.project, fault).context():
        outcome = run_once(ledger, "run-1", DESCRIPTION, policy, work)
        stored = RunRecord.get_by_id("run-1")
        lock = JobLock.get_by_id("nightly")
    assert fault.injected == 1, "the fault was never injected: the site is not on this path"
    assert runs == [1]  # once, by the one attempt that held the lease
    assert isinstance(outcome, Finished), outcome
    # Completed: no lease is left that nobody holds, and the job's lock went with the finish.
    assert (stored.status, stored.attempt, stored.result) == (RunStatus.COMPLETED, 1, {"ran": 1})
    assert lock is None
    with Flask(__name__).test_request_context():
        assert outcome_response(outcome).status_code == 200  # documented: done


@pytest.mark.parametrize("code", NOT_APPLIED + IN_DOUBT, ids=lambda code: code.name)
def test_a_fault_on_a_duplicates_claim_is_the_documented_409(datastore, clock, code):
    """While the first attempt holds its lease, a duplicate whose claim meets the fault is told to
    come back (409), never a 5xx, and never runs the job."""
    policy = RunPolicy(lease_seconds=60, retention_seconds=3600)
    ledger = Ledger(clock)
    with ndb_client_of(datastore).context():
        held = ledger.replay_or_claim("run-1", DESCRIPTION, policy)
    fault = OneFault("claim", "/Commit", code)
    ran: list[int] = []
    with intercepted_client(datastore.project, fault).context():
        outcome = run_once(Ledger(clock), "run-1", DESCRIPTION, policy, lambda attempt: ran.append(1))
        stored = RunRecord.get_by_id("run-1")
    assert fault.injected == 1 and ran == []
    with Flask(__name__).test_request_context():
        assert outcome_response(outcome).status_code == 409, outcome
    assert stored.attempt_id == held.attempt.attempt_id  # untouched


def test_a_record_deleted_since_it_was_read_is_claimed_afresh(datastore, clock):
    """F3: the finish's fenced write meets NOT_FOUND (TTL or the cleanup removed the record after
    ``expire_at``): not a 500 but the transaction's read, which calls the attempt stale (409)."""
    policy = RunPolicy(lease_seconds=60, retention_seconds=3600)
    ledger = Ledger(clock)
    with ndb_client_of(datastore).context():
        claimed = ledger.replay_or_claim("run-1", DESCRIPTION, policy)
        RunRecord.get_by_id("run-1").key.delete()
        finished = ledger.complete_run(claimed.attempt, {"n": 1}, policy)
        renewed = ledger.renew_lease(claimed.attempt, 60)
        again = ledger.replay_or_claim("run-1", DESCRIPTION, policy)
    assert type(finished).__name__ == "Stale" and type(renewed).__name__ == "Stale"
    with Flask(__name__).test_request_context():
        assert outcome_response(finished).status_code == 409
    assert type(again).__name__ == "Claimed" and again.attempt.number == 1  # a fresh claim


class LookupFailsInsertInDoubt(grpc.UnaryUnaryClientInterceptor):
    """F2: the claim's lookup fails and its insert lands with its answer lost."""

    def __init__(self) -> None:
        self.lookups = self.commits = 0

    def intercept_unary_unary(self, continuation, details, request):
        if details.method.endswith("/Lookup") and not self.lookups:
            self.lookups += 1
            return FailedCall(grpc.StatusCode.UNAVAILABLE, "injected: the lookup failed")
        if details.method.endswith("/Commit") and not self.commits:
            self.commits += 1
            continuation(details, request).result()  # the insert lands
            return FailedCall(grpc.StatusCode.DEADLINE_EXCEEDED, "injected: its answer lost")
        return continuation(details, request)


def test_a_failed_lookup_beside_an_insert_in_doubt_is_settled_not_a_500(datastore, clock):
    """Before, this was a 500 with a live lease nobody held: every retry a 409 for a whole lease."""
    policy = RunPolicy(lease_seconds=60, retention_seconds=3600)
    faults = LookupFailsInsertInDoubt()
    ran: list[int] = []
    with intercepted_client(datastore.project, faults).context():
        outcome = run_once(Ledger(clock), "run-1", DESCRIPTION, policy, lambda attempt: ran.append(attempt.number))
        stored = RunRecord.get_by_id("run-1")
    assert (faults.lookups, faults.commits) == (1, 1)
    assert isinstance(outcome, Finished) and ran == [1]  # its own landed insert, recognised
    assert stored.status == RunStatus.COMPLETED and len(stored.attempts) == 1


class OutageAfterTheInsert(grpc.UnaryUnaryClientInterceptor):
    """The claim's insert lands with its answer lost, then every call fails for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.began: float | None = None
        self.failed = 0

    def intercept_unary_unary(self, continuation, details, request):
        import time

        if self.began is None and details.method.endswith("/Commit"):
            continuation(details, request).result()  # the insert lands
            self.began = time.monotonic()
            return FailedCall(grpc.StatusCode.UNAVAILABLE, "injected: the answer lost")
        if self.began is not None and time.monotonic() < self.began + self.seconds:
            self.failed += 1
            return FailedCall(grpc.StatusCode.UNAVAILABLE, "injected: an outage")
        return continuation(details, request)


def test_a_claim_that_gives_up_after_its_insert_landed_releases_it(datastore, clock, monkeypatch):
    """An outage longer than the claim's patience, just after its insert landed unconfirmed: the
    answer is the error (500, for Scheduler to retry), but the record is released, not left
    in_progress under a lease nobody holds; the retry runs the job at once."""
    from google.api_core import exceptions

    from dedup import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "CLAIM_PATIENCE_SECONDS", 0.3)
    policy = RunPolicy(lease_seconds=600, retention_seconds=3600)
    outage = OutageAfterTheInsert(0.6)
    ran: list[int] = []
    with intercepted_client(datastore.project, outage).context():
        with pytest.raises(exceptions.ServiceUnavailable):
            run_once(Ledger(clock), "run-1", DESCRIPTION, policy, lambda attempt: ran.append(attempt.number))
    assert outage.failed > 0 and ran == []
    with ndb_client_of(datastore).context():
        stored = RunRecord.get_by_id("run-1")
        assert stored.status == RunStatus.RELEASED and stored.error["type"] == "ClaimUnconfirmed"
        assert not stored.lease_is_live(clock.now())
        retried = run_once(Ledger(clock), "run-1", DESCRIPTION, policy, lambda attempt: ran.append(attempt.number))
    assert isinstance(retried, Finished) and ran == [2]
