"""The one retry loop (dedup/transactions.py), with no emulator: what it tries again, for how long,
and what a transaction's next try names.  The loop on Datastore is held by tests/test_record_store.py
(aborted commits) and tests/test_store_contract.py (every store)."""

from __future__ import annotations

import datetime

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup.memory_store import MemoryStore
from dedup.transactions import REFUSALS_TRIED, get_many, retried, transact
from models.audit import AuditMark


@pytest.fixture(autouse=True)
def context():
    with ndb.Client(project="transactions", credentials=AnonymousCredentials()).context():
        yield


def failing(*errors: Exception):
    """A call that raises ``errors`` in turn, then answers how many tries it took."""
    tries = []

    def call():
        tries.append(None)
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return len(tries)

    return call


@pytest.mark.parametrize(
    "error",
    [
        exceptions.Aborted("contention"),
        exceptions.ServiceUnavailable("down"),
        exceptions.DeadlineExceeded("late: in doubt"),
        exceptions.InternalServerError("in doubt"),
        exceptions.NotFound("deleted since it was read"),
    ],
)
def test_contention_outages_doubts_and_a_refusal_are_tried_again(error):
    assert retried(failing(error, error), 5, "call") == 3


def test_patience_running_out_raises_the_last_error():
    always = failing(*[exceptions.Aborted("contention")] * 1000)
    with pytest.raises(exceptions.Aborted):
        retried(always, 0.1, "call")


def test_a_refusal_is_tried_again_only_a_few_times_whatever_the_patience():
    refused = failing(*[exceptions.FailedPrecondition("no")] * (REFUSALS_TRIED + 1))
    with pytest.raises(exceptions.FailedPrecondition):
        retried(refused, 60, "call")


def test_any_other_error_is_raised_at_once():
    with pytest.raises(exceptions.PermissionDenied):
        retried(failing(exceptions.PermissionDenied("no"), exceptions.PermissionDenied("no")), 60, "call")
    with pytest.raises(ValueError):
        retried(failing(ValueError("a bug")), 60, "call")


class Watched(MemoryStore):
    """The memory store, noting what each transaction's try was begun with."""

    def __init__(self) -> None:
        super().__init__()
        self.previous: list[bytes | None] = []

    def transaction(self, previous=None, begin_in_read=None):
        self.previous.append(previous)
        return super().transaction(previous, begin_in_read)


def test_a_try_after_an_abort_names_the_aborted_one_and_after_a_doubt_none():
    store = Watched()
    began = []
    errors = iter([exceptions.Aborted("contention"), exceptions.DeadlineExceeded("in doubt")])

    def body(transaction):
        began.append(transaction.began)
        transaction.get([ndb.Key(AuditMark, "m")])
        error = next(errors, None)
        if error is not None:
            raise error
        return "done"

    assert transact(body, 5, store)[0] == "done"
    assert store.previous == [None, began[0], None]


def test_a_read_that_fences_nothing_is_tried_again_too():
    store = MemoryStore()
    store.put(AuditMark(id="m", checked_until=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)))
    lookups = failing(exceptions.ServiceUnavailable("down"))
    real = store.lookup_many

    def flaky(keys):
        lookups()
        return real(keys)

    store.lookup_many = flaky  # type: ignore[method-assign]
    (mark, absent) = get_many(store, [ndb.Key(AuditMark, "m"), ndb.Key(AuditMark, "n")])
    assert mark.key.id() == "m" and absent is None
    assert get_many(store, []) == []


def answer_lost_once(store: MemoryStore, error: Exception) -> MemoryStore:
    """``store`` whose first commit lands and then has its answer lost (``error``)."""
    begin, lost = store.transaction, [error]

    def transaction(*args, **kwargs):
        made = begin(*args, **kwargs)
        commit = made.commit

        def landed_then_lost():
            commit()
            if lost:
                raise lost.pop()

        made.commit = landed_then_lost
        return made

    store.transaction = transaction  # type: ignore[method-assign]
    return store


def test_a_duplicate_whose_count_landed_in_doubt_is_counted_once():
    """A tally cannot tell its own landed commit: a try in doubt is not repeated, so the count
    stays a floor (the page says so), never one delivery counted twice."""
    from models.delivery_tally import DeliveryTally
    from schedules import tallies

    store = answer_lost_once(MemoryStore(), exceptions.DeadlineExceeded("answer lost"))
    now = datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.UTC)
    with pytest.raises(exceptions.DeadlineExceeded):
        tallies.tally_duplicate("sj", now, tallies.DuplicateDelivery(now, "i", 200), store)
    (tally,) = get_many(store, [DeliveryTally.key_for("sj", tallies.hour_of(now))])
    assert tally.duplicates == 1


def test_a_body_that_cannot_settle_a_doubt_is_still_tried_again_after_an_abort():
    tries = []

    def body(transaction):
        tries.append(None)
        if len(tries) == 1:
            raise exceptions.Aborted("contention")

    transact(body, 5.0, MemoryStore(), settles_doubt=False)
    assert len(tries) == 2
    with pytest.raises(exceptions.ServiceUnavailable):
        down = failing(exceptions.ServiceUnavailable("down"))
        transact(lambda transaction: down(), 5.0, MemoryStore(), settles_doubt=False)
