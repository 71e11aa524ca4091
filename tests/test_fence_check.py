"""The version fence is proved at start-up, never assumed (dedup/fence_check.py, dedup/fence_probe.py).

On the legacy Datastore emulator a stale-version update or delete is refused, as the v1 API's
contract says, and the fenced fast path is chosen; on the Firestore emulator in Datastore mode
both are applied (the difference recorded in docs/retention-and-cost.md, "Which emulator"), and
the transactional path is chosen, on which a stale attempt still changes nothing.
"""

from __future__ import annotations

import logging
import time

import grpc
import pytest
from google.cloud import ndb

from dedup import fence_check, fence_probe
from dedup.clock import ManualClock
from dedup.fence_check import FenceCheck, FenceMode
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, Renewed, Stale
from dedup.record_store import RecordStore
from devtools.rpc_counter import counting_client, intercepted_client
from models import RunRecord, RunStatus
from tests.conftest import ndb_client_of

pytestmark = pytest.mark.both_emulators

POLICY = RunPolicy(lease_seconds=60, retention_seconds=3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="j", scheduler_job_name="j")
EXPECTED = {"legacy": FenceMode.VERSION, "firestore": FenceMode.TRANSACTION}


@pytest.fixture
def unchecked(datastore):
    """The database as a new process finds it: nobody has checked its fence."""
    database = fence_check.database_of(ndb_client_of(datastore))
    fence_check.forget(database)
    yield database
    fence_check.forget(database)
    fence_probe.verify(ndb_client_of(datastore))  # as the other tests expect it


def test_each_emulator_gets_the_path_its_fence_allows(datastore, datastore_flavor, unchecked):
    check = fence_probe.verify(ndb_client_of(datastore))
    assert check.mode is EXPECTED[datastore_flavor]
    if datastore_flavor == "firestore":  # it applies a stale update (firebase-tools: no conflict detection)
        assert "update fenced on a stale version was not refused" in check.reason
    # The Firestore emulator's commit of a transaction its Lookup began times out on that read's lock.
    assert check.begins_in_read is (datastore_flavor == "legacy")
    assert fence_check.current(unchecked) == check
    with ndb_client_of(datastore).context():  # the scratch entity is gone
        assert not list(ndb.Query(kind=fence_probe.PROBE_KIND).fetch())


def test_an_unchecked_database_takes_the_transactional_path(datastore, unchecked):
    assert fence_check.current(unchecked).mode is FenceMode.TRANSACTION
    client, counter = counting_client(datastore.project)
    ledger = Ledger(ManualClock())
    with client.context():
        claimed = ledger.replay_or_claim("r", DESCRIPTION, POLICY)
        assert isinstance(claimed, Claimed)
        counter.wait_until_idle()
        counter.reset()
        assert isinstance(ledger.complete_run(claimed.attempt, {"ok": 1}, POLICY), Finished)
        counter.wait_until_idle()
    # The finish reads first, in a transaction begun on its own (unchecked: a read may not begin it).
    assert counter.snapshot() == {"BeginTransaction": 1, "Lookup": 1, "Commit": 1}


def test_a_check_that_cannot_run_keeps_the_safe_path_and_says_why(datastore, unchecked, caplog):
    def broken() -> FenceCheck:
        raise RuntimeError("no route to Datastore")

    with caplog.at_level(logging.WARNING, logger="dedup.fence_probe"):
        check = fence_probe.verify(ndb_client_of(datastore), probe=broken)
    assert check.mode is FenceMode.TRANSACTION and "no route to Datastore" in check.reason
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "4 round trips per fresh run" in warning.getMessage()  # names the cost
    assert fence_probe.verify(ndb_client_of(datastore)) == check  # once per process


class StaleCommitsError(grpc.UnaryUnaryClientInterceptor):
    """Every commit fenced on the probe's first version (the stale ones) answers ``code`` instead of
    being sent: production refusing a stale version as a whole-commit error (one reading of the
    contract), or a quota, or an answer lost (never sent, so it proves nothing either way)."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.first_version: int | None = None
        self.current_update_sent = False

    def intercept_unary_unary(self, continuation, details, request):
        if details.method.endswith("/Commit"):
            fenced = [m.base_version for m in request.mutations if m.base_version]
            if fenced and fenced[0] == self.first_version:
                if not self.current_update_sent:  # the probe's update on the current version
                    self.current_update_sent = True
                    return continuation(details, request)
                from tests.support.lost_answers import FailedCall

                return FailedCall(self.code, "injected at a commit fenced on a stale version")
            call = continuation(details, request)
            if self.first_version is None and call.exception() is None:
                self.first_version = call.result().mutation_results[0].version  # the scratch insert's
            return call
        return continuation(details, request)


@pytest.mark.parametrize(
    "code, proves",
    [
        (grpc.StatusCode.FAILED_PRECONDITION, True),  # the whole commit refused as stale
        (grpc.StatusCode.INVALID_ARGUMENT, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),  # a quota says nothing of versions
        (grpc.StatusCode.PERMISSION_DENIED, False),
        (grpc.StatusCode.UNAVAILABLE, False),  # in doubt
        (grpc.StatusCode.DEADLINE_EXCEEDED, False),
    ],
)
def test_only_a_refusal_that_means_stale_proves_the_fence(datastore, unchecked, code, proves):
    """On both emulators the stale commits never reach the database here: what decides is what
    their answer says.  A refusal for another reason must not prove the fence (on the Firestore
    emulator, which applies stale writes, that would be the fault the check exists to keep out)."""
    client = intercepted_client(datastore.project, StaleCommitsError(code))
    check = fence_probe.verify(client)
    assert check.mode is (FenceMode.VERSION if proves else FenceMode.TRANSACTION), check


def test_a_stale_attempt_changes_nothing_on_the_path_chosen(datastore, datastore_flavor, clock):
    """The guarantee on both emulators: after a takeover, the old attempt's renewal and finish are
    refused, and the record is the new attempt's."""
    ledger = Ledger(clock)
    with ndb_client_of(datastore).context():
        old = ledger.replay_or_claim("r", DESCRIPTION, POLICY)
        assert isinstance(old, Claimed)
        clock.advance(61)  # its lease runs out
        new = ledger.replay_or_claim("r", DESCRIPTION, POLICY)
        assert isinstance(new, Claimed) and new.attempt.number == 2
        assert isinstance(ledger.renew_lease(old.attempt, 60), Stale)
        assert isinstance(ledger.complete_run(old.attempt, {"by": "old"}, POLICY), Stale)
        assert isinstance(ledger.renew_lease(new.attempt, 60), Renewed)
        stored = RunRecord.get_by_id("r")
        assert (stored.attempt_id, stored.status) == (new.attempt.attempt_id, RunStatus.IN_PROGRESS)


def test_on_the_firestore_emulator_the_fast_path_would_let_a_stale_attempt_write(
    datastore, datastore_flavor, clock, unchecked
):
    """Why the check exists: forced onto the fenced path, the Firestore emulator lets the old
    attempt's finish overwrite the attempt that took over (on the legacy one it is refused)."""
    fence_check.record(unchecked, FenceCheck(FenceMode.VERSION, "forced by the test"))
    ledger = Ledger(clock)
    with ndb_client_of(datastore).context():
        old = ledger.replay_or_claim("r", DESCRIPTION, POLICY)
        clock.advance(61)
        new = ledger.replay_or_claim("r", DESCRIPTION, POLICY)
        assert isinstance(old, Claimed) and isinstance(new, Claimed)
        old.attempt.fence.advance(old.record, old.attempt.fence.take()[1])  # its last write's version
        finished = ledger.complete_run(old.attempt, {"by": "old"}, POLICY)
        stored = RunRecord.get_by_id("r")
    if datastore_flavor == "legacy":
        assert isinstance(finished, Stale) and stored.attempt_id == new.attempt.attempt_id
    else:  # applied: the very fault the start-up check keeps out
        assert isinstance(finished, Finished) and stored.attempt_id == old.attempt.attempt_id


def test_status_says_which_path_is_in_force(make_client, datastore_flavor):
    from tests.support.deliveries import JOBS

    client = make_client(JOBS)
    body = client.get("/api/v1/status").json["datastore"]
    assert body["fence"] == str(EXPECTED[datastore_flavor])
    assert body["round_trips_per_fresh_run"] == {"legacy": 2, "firestore": 4}[datastore_flavor]
    assert body["database"] == "(default)"


def test_create_app_checks_the_fence_off_the_request_path(make_client, datastore, datastore_flavor, unchecked):
    from tests.support.deliveries import JOBS

    make_client(JOBS)  # starts the check on a thread of its own
    deadline = time.monotonic() + 30
    while fence_check.current(unchecked) is fence_check.UNCHECKED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fence_check.current(unchecked).mode is EXPECTED[datastore_flavor]


def test_a_check_that_could_not_run_is_tried_again_in_the_background(datastore, datastore_flavor, unchecked):
    attempts = []
    waits: list[float] = []

    def client():
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("no credentials yet")
        return ndb_client_of(datastore)

    fence_probe.verify_in_background(client, sleep=waits.append).join(30)
    assert len(attempts) == 3 and waits == list(fence_probe.RETRY_SECONDS[:2])
    assert fence_check.current(unchecked).mode is EXPECTED[datastore_flavor]


def test_the_store_follows_the_check(datastore, unchecked):
    with ndb_client_of(datastore).context():
        assert not RecordStore.of_context().fenced
        fence_check.record(unchecked, FenceCheck(FenceMode.VERSION, "test"))
        assert RecordStore.of_context().fenced
