"""Transactions begun before they are needed (dedup/transactions.py, EarlyTransaction).

The ledger begins the claim's transaction beside the fast-path lookup and
the finish's beside the claim.  These tests hold what that must never
change: an early transaction that is too old, or ended behind its back, is
replaced by a new one; one nobody uses is rolled back; and every write
lands exactly once either way.
"""

from __future__ import annotations

import threading

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb
from google.cloud.datastore_v1.types import datastore as datastore_pb2

from dedup import ledger as ledger_module
from dedup import transactions
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, Stale
from dedup.transactions import EarlyTransaction, run_transaction
from devtools.rpc_counter import counting_client
from models import RunRecord, RunStatus

POLICY = RunPolicy(60, 3600)


class Tally(ndb.Model):
    count = ndb.IntegerProperty(default=0)


def add_one() -> int:
    tally = Tally.get_by_id("t") or Tally(id="t")
    tally.count += 1
    tally.put()
    return tally.count


def test_an_early_transaction_is_used_once(ndb_context):
    early = EarlyTransaction()
    assert run_transaction(add_one, 3, early=early) == 1
    assert early.take() is None  # spent: the next write begins its own
    assert run_transaction(add_one, 3, early=early) == 2


def test_one_ended_behind_its_back_gives_way_to_a_new_one(ndb_context, datastore, caplog):
    caplog.set_level("INFO", logger="dedup.transactions")
    early = EarlyTransaction()
    client = ndb.get_context().client
    transaction_id = early._begin.result()
    client.stub.rollback(datastore_pb2.RollbackRequest(project_id=datastore.project, transaction=transaction_id))
    assert run_transaction(add_one, 3, early=early) == 1  # its try failed; a new transaction wrote, once
    assert Tally.get_by_id("t", use_cache=False).count == 1
    assert "early transaction failed" in caplog.text


def test_a_run_works_when_every_early_transaction_is_too_old(datastore, clock, monkeypatch):
    """A waiting call's poll (no speculation) still begins its finish's transaction early."""
    monkeypatch.setattr(transactions, "EARLY_TRANSACTION_MAX_AGE_SECONDS", -1.0)  # a job longer than the cap
    client, counter = counting_client(datastore.project)
    with client.context():
        ledger = Ledger(clock)
        claimed = ledger.replay_or_claim("run-1", RunDescription("scheduler", "invoice"), POLICY, speculate=False)
        assert isinstance(claimed, Claimed)
        finished = ledger.complete_run(claimed.attempt, {}, POLICY, early=claimed.finish_transaction)
        assert isinstance(finished, Finished)
        counter.wait_until_idle()
        # The finish's early transaction was rolled back unused; the finish began its own.
        assert counter.snapshot() == {"Lookup": 3, "BeginTransaction": 3, "Commit": 2, "Rollback": 1}
        assert RunRecord.get_by_id("run-1").status == RunStatus.COMPLETED


def test_a_finish_transaction_nobody_needs_is_rolled_back(datastore, jobs_file, clock):
    """A claim that loses (here: a live lease found inside the transaction) discards the finish's."""
    client, counter = counting_client(datastore.project)
    with client.context():
        ledger = Ledger(clock)
        owner = ledger.claim_run("run-1", RunDescription("scheduler", "invoice"), POLICY)
        assert isinstance(owner, Claimed)
        counter.reset()
        early = EarlyTransaction()
        refused = ledger.claim_run(
            "run-1", RunDescription("scheduler", "invoice"), POLICY, early=early, prepare_finish=True
        )
        assert refused.__class__.__name__ == "InProgress" and getattr(refused, "finish_transaction", None) is None
    counter.wait_until_idle()
    assert counter.snapshot() == {"BeginTransaction": 2, "Lookup": 1, "Commit": 1, "Rollback": 1}


def test_a_stale_verdict_in_an_early_transaction_is_checked_again_and_stays(ndb_context, clock):
    """A finish whose run was taken over is stale in the early transaction and again in a new one."""
    ledger = Ledger(clock)
    first = ledger.claim_run("run-1", RunDescription("scheduler", "invoice"), POLICY)
    clock.advance(POLICY.lease_seconds + 1)
    second = ledger.claim_run("run-1", RunDescription("scheduler", "invoice"), POLICY)
    assert isinstance(second, Claimed) and second.attempt.number == 2
    assert isinstance(ledger.complete_run(first.attempt, {"late": True}, POLICY, early=EarlyTransaction()), Stale)
    assert ledger.finish_begins_early is True  # truly stale: nothing learnt about the database
    finished = ledger.complete_run(second.attempt, {"ok": True}, POLICY, early=EarlyTransaction())
    assert isinstance(finished, Finished) and RunRecord.get_by_id("run-1").result == {"ok": True}


def test_an_early_try_that_gave_up_retrying_gives_way_to_the_loop(ndb_context):
    """NDB's own retries of a read raise RetryError, which is no GoogleAPICallError: still a transient error."""
    tries = []

    def flaky_then_add_one() -> int:
        tries.append(1)
        if len(tries) == 1:
            raise api_exceptions.RetryError("gave up", cause=api_exceptions.ServiceUnavailable("down"))
        return add_one()

    assert run_transaction(flaky_then_add_one, 3, early=EarlyTransaction()) == 1
    assert len(tries) == 2 and Tally.get_by_id("t", use_cache=False).count == 1


def test_an_early_transaction_is_not_taken_in_another_context(ndb_context, ndb_client):
    """Its BeginTransaction's answer arrives on the loop of the context that sent it."""
    early = EarlyTransaction()
    taken = []

    def elsewhere():
        with ndb_client.context():
            taken.append(early.take())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert taken == [None] and early.take() is None  # discarded: rolled back once it began


def test_a_finish_that_missed_its_claim_turns_early_finishes_off(ndb_context, clock, monkeypatch):
    """Where a transaction's reads are served from its start, a finish begun beside the claim is
    stale every time: the re-check finds the run owned after all, and the ledger stops beginning them early."""
    ledger = Ledger(clock)
    claimed = ledger.replay_or_claim("run-1", RunDescription("scheduler", "invoice"), POLICY, speculate=False)
    assert isinstance(claimed, Claimed) and claimed.finish_transaction is not None
    real = ledger_module.run_transaction

    def as_if_read_at_its_start(callback, patience, early=None):
        if early is None:
            return real(callback, patience)
        early.take()
        early.served = True  # the early try ran, and did not see the claim
        return Stale("run-1", claimed.attempt.number, None)

    monkeypatch.setattr(ledger_module, "run_transaction", as_if_read_at_its_start)
    finished = ledger.complete_run(claimed.attempt, {"ok": True}, POLICY, early=claimed.finish_transaction)
    assert isinstance(finished, Finished) and RunRecord.get_by_id("run-1").status == RunStatus.COMPLETED
    assert ledger.finish_begins_early is False
    monkeypatch.setattr(ledger_module, "run_transaction", real)
    later = ledger.replay_or_claim("run-2", RunDescription("scheduler", "invoice"), POLICY, speculate=False)
    assert isinstance(later, Claimed) and later.finish_transaction is None


def test_the_ndb_whose_transaction_body_in_transaction_copies_is_the_one_installed():
    """in_transaction uses NDB internals (_datastore_api, Context.new): an upgrade must re-read them.

    When this fails, compare dedup/transactions.py's in_transaction with the new
    google/cloud/ndb/_transaction.py ``_transaction_async`` and move the pin here.
    """
    from importlib.metadata import version

    assert version("google-cloud-ndb") == "2.7.1"


def test_one_that_never_began_is_not_taken_and_its_discard_sends_nothing(datastore):
    """Datastore unreachable when it was begun: take() says begin another; discard() has nothing to end."""
    from devtools.emulator import free_port

    unreachable, counter = counting_client(datastore.project, f"127.0.0.1:{free_port()}")
    with unreachable.context():
        assert EarlyTransaction().take() is None
        never = EarlyTransaction()
        never.discard()
    counter.wait_until_idle()
    assert counter.snapshot() == {"BeginTransaction": 2}  # no Rollback for a transaction that never began
