"""The storage interface's contract (dedup/store.py), held against every implementation.

The Datastore store on each of Google's two emulators, and the in-memory store: each must give
the same answers to the same writes, so a test of the decisions on the memory store says what
the Datastore store does.  Where an emulator departs from the v1 API's contract (the Firestore
emulator applies a stale version), the store says so (``fenced``) and the ledger does not lean
on it; the contract then asks only that the store not claim a fence it lacks.
"""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb
from google.cloud.datastore_v1.types.entity import Entity

from dedup.clock import ManualClock
from dedup.job_lock import JobLock
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.memory_store import MemoryStore
from dedup.outcomes import Claimed, Finished, InProgress, Overlap, Released, Replayed, Stale
from dedup.record_store import LOOKUP_KEYS, RecordStore, encode
from dedup.store import Applied, Exists, Refused, StaleVersion, Store, Versioned
from dedup.transactions import get_many, transact
from models import RunRecord, RunStatus
from models.audit import AuditMark
from models.delivery_tally import DeliveryTally
from models.schedule_history import ScheduleHistory
from models.schedule_pause import SchedulePauses
from schedules.pauses import change_pause
from schedules.pauses import paused as pauses_paused
from schedules.pauses import resumed as pauses_resumed
from schedules.tallies import DuplicateDelivery, deliveries_of_slot, tally_duplicate
from tests.conftest import flavor_params, ndb_client_of, wiped_emulator

T = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
SECOND = datetime.timedelta(seconds=1)
BACKENDS = [*flavor_params(), "memory"]


@pytest.fixture(params=BACKENDS)
def store(request, monkeypatch):
    """Each implementation, empty, in an NDB context (the memory store's never calls out)."""
    if request.param == "memory":
        with ndb.Client(project="store-contract", credentials=AnonymousCredentials()).context():
            yield MemoryStore()
        return
    running = wiped_emulator(request.param, request, monkeypatch)
    with ndb_client_of(running).context():
        yield RecordStore.of_context()


def record(run_id: str = "r" * 64, **changes) -> RunRecord:
    values = {
        "source": "scheduler",
        "job_id": "nightly",
        "status": RunStatus.IN_PROGRESS.value,
        "attempt_id": "a" * 32,
        "attempt": 1,
        "lease_expires": T,
        "expire_at": T + datetime.timedelta(days=1),
        "created": T,
        "updated": T,
        "attempts": [{"attempt": 1, "attempt_id": "a" * 32, "outcome": None}],
        **changes,
    }
    return RunRecord(id=run_id, **values)


def fields(found: Versioned | None) -> dict | None:
    return None if found is None else found.record.to_dict()


def test_an_insert_lands_only_where_nothing_is(store: Store):
    first = store.insert(record())
    assert isinstance(first, Applied)
    assert store.insert(record(attempt_id="b" * 32)) == Exists()
    found = store.lookup("r" * 64)
    assert found is not None and found.version == first.version
    assert fields(found) == record().to_dict()  # as written, field for field


def test_a_lookup_beside_an_insert_finds_what_refused_it(store: Store):
    first, written = store.lookup_and_insert(record())
    assert isinstance(written, Applied)
    assert first is None or first.record.attempt_id == "a" * 32  # the two race: it may find this very insert
    found, written = store.lookup_and_insert(record(attempt_id="b" * 32))
    assert written == Exists() and found is not None and found.record.attempt_id == "a" * 32


def test_an_update_on_the_current_version_lands_and_moves_it(store: Store):
    first = store.insert(record())
    assert isinstance(first, Applied)
    second = store.update(record(attempt=2), first.version)
    assert isinstance(second, Applied) and second.version != first.version
    found = store.lookup("r" * 64)
    assert found is not None and (found.version, found.record.attempt) == (second.version, 2)


def test_a_stale_version_is_refused_wherever_the_store_says_it_is_fenced(store: Store):
    first = store.insert(record())
    assert isinstance(first, Applied)
    assert isinstance(store.update(record(attempt=2), first.version), Applied)
    stale = store.update(record(attempt=3), first.version)
    if not store.fenced:  # it does not claim what it lacks (the Firestore emulator applies it)
        assert store.fence.mode == "transaction"
        return
    assert stale == StaleVersion()
    assert store.lookup("r" * 64).record.attempt == 2
    assert store.delete_if(record().key, first.version) == StaleVersion()
    assert store.lookup("r" * 64) is not None


def test_an_update_of_nothing_is_refused_and_writes_nothing(store: Store):
    answer = store.update(record(), 1)
    assert isinstance(answer, Refused) and isinstance(answer.error, exceptions.NotFound)
    assert store.lookup("r" * 64) is None


def test_a_delete_on_the_current_version_removes_it(store: Store):
    first = store.insert(record())
    assert isinstance(first, Applied)
    assert isinstance(store.delete_if(record().key, first.version), Applied)
    assert store.lookup("r" * 64) is None


def test_lookups_keep_the_order_asked_and_say_what_is_absent(store: Store):
    store.insert(record("a" * 64))
    store.insert(record("c" * 64))
    keys = [ndb.Key(RunRecord, run_id) for run_id in ("c" * 64, "b" * 64, "a" * 64)]
    assert [found and found.record.key.id() for found in store.lookup_many(keys)] == ["c" * 64, None, "a" * 64]


def test_only_records_unchanged_since_they_were_read_are_deleted(store: Store):
    for run_id in ("a" * 64, "b" * 64):
        store.insert(record(run_id))
    read = store.lookup_many([ndb.Key(RunRecord, "a" * 64), ndb.Key(RunRecord, "b" * 64)])
    assert isinstance(store.update(record("b" * 64, attempt=2), read[1].version), Applied)  # written since
    assert store.delete_unchanged([found for found in read if found]) == 1
    assert store.lookup("a" * 64) is None and store.lookup("b" * 64).record.attempt == 2


def test_a_transaction_reads_then_writes_all_or_none(store: Store):
    def body(transaction):
        assert transaction.get([record().key]) == [None]
        transaction.put(record())
        transaction.put(record("s" * 64))
        return "done"

    result, transaction = transact(body, 5, store)
    assert result == "done"
    for run_id in ("r" * 64, "s" * 64):
        found = store.lookup(run_id)
        assert found is not None and transaction.versions[found.record.key] == found.version


def test_a_transaction_that_writes_nothing_changes_nothing(store: Store):
    store.insert(record())
    before = store.lookup("r" * 64)
    result, transaction = transact(lambda t: t.get([record().key]), 5, store)
    assert fields(result[0]) == fields(before) and transaction.versions == {}
    assert store.lookup("r" * 64).version == before.version


# -- the other entities: what schedules/ and the job rows read and write through the store ------


def others() -> list:
    """One entity of every other model the store writes, each property type set (a flag both ways)."""
    return [
        SchedulePauses(
            id="p/l/paused", pauses=[{"since": "2030-01-02T03:04:05Z", "paused_by": "user:a", "note": None}]
        ),
        AuditMark(id="p/l/audited", checked_until=T, pass_id="x" * 32, previous_pass_id=None, failure_streak=2),
        DeliveryTally(key=DeliveryTally.key_for("p/l/tallied", T), hour=T, duplicates=3, by_slot={"s": {"n": 3}}),
        ScheduleHistory(id="p/l/seen", versions=[{"schedule": "0 * * * *", "time_zone": "UTC"}], file_paused=True),
        ScheduleHistory(id="p/l/unseen", versions=[], file_paused=False),
        ScheduleHistory(id="p/l/never", versions=[]),
        JobLock(id="nightly", run_id="r" * 64, attempt_id="a" * 32, lease_expires=T),
    ]


def test_a_transaction_that_reads_nothing_writes_every_model_as_it_reads_them(store: Store):
    entities = others()

    def put_all(transaction):
        for entity in entities:
            transaction.put(entity)

    _, transaction = transact(put_all, 5, store)
    keys = [entity.key for entity in entities]
    found = store.lookup_many(keys)
    assert [f.record.to_dict() for f in found] == [entity.to_dict() for entity in entities]
    assert [f.version for f in found] == [transaction.versions[key] for key in keys]
    assert get_many(store, [*keys, ndb.Key(AuditMark, "absent")]) == [*found_records(found), None]
    assert get_many(store, []) == []


def found_records(found: list[Versioned | None]) -> list:
    return [f.record if f else None for f in found]


def test_a_lookup_over_datastores_limit_of_keys_is_split_and_keeps_the_order(store: Store):
    store.insert(record("a" * 64))
    store.insert(record("z" * 64))
    keys = [ndb.Key(RunRecord, f"{n:064d}") for n in range(LOOKUP_KEYS - 1)]
    keys = [ndb.Key(RunRecord, "a" * 64), *keys, ndb.Key(RunRecord, "z" * 64)]  # one more than a Lookup takes
    found = [f and f.record.key.id() for f in store.lookup_many(keys)]
    assert found == ["a" * 64, *[None] * (LOOKUP_KEYS - 1), "z" * 64]


def test_the_schedules_writes_land_alike_on_every_store(store: Store):
    """A pause and its resume, a tally counted twice: each a transaction of the store, read back."""
    job = SimpleNamespace(project="p", location="l", name="nightly")  # all a pause's key needs
    paused = change_pause(job, lambda pauses: pauses_paused(pauses, T, "user:a", "why"), store)
    resumed = change_pause(job, lambda pauses: pauses_resumed(pauses, T + datetime.timedelta(hours=1), "user:b"), store)
    assert len(paused) == 1 and paused[0].until is None
    assert [(p.since, p.until, p.resumed_by) for p in resumed] == [(T, T + datetime.timedelta(hours=1), "user:b")]
    (stored,) = get_many(store, [ndb.Key(SchedulePauses, "p/l/nightly")])
    assert stored.pauses == [p.stored() for p in resumed]
    for received in (T, T + SECOND):
        tally_duplicate("p/l/nightly", T, DuplicateDelivery(received, "i-1", 200), store)
    counted = deliveries_of_slot("p/l/nightly", T, T + datetime.timedelta(minutes=5), store)
    assert counted is not None and counted.count == 2 and [d.received for d in counted.listed] == [T, T + SECOND]


@pytest.fixture(params=flavor_params())
def datastore_store(request, monkeypatch):
    running = wiped_emulator(request.param, request, monkeypatch)
    with ndb_client_of(running).context():
        yield RecordStore.of_context()


def test_what_the_store_writes_ndb_reads_the_same_and_the_other_way(datastore_store: RecordStore):
    """The pause intervals are written by the store and read by NDB (its batched reads): one encoding,
    to the entity as stored (indexing and meanings included)."""
    written = others()
    transact(lambda transaction: [transaction.put(entity) for entity in written], 5, datastore_store)
    assert [entity.to_dict() for entity in ndb.get_multi([e.key for e in written])] == [e.to_dict() for e in written]
    by_ndb = [SchedulePauses(id="p/l/by-ndb", pauses=[]), *others()]
    for entity in by_ndb:
        entity.key = ndb.Key(entity.key.kind(), f"by-ndb/{entity.key.id()}")
    ndb.put_multi(by_ndb)
    assert [e.to_dict() for e in get_many(datastore_store, [e.key for e in by_ndb])] == [e.to_dict() for e in by_ndb]
    for entity in by_ndb:
        assert Entity.pb(datastore_store.lookup_entity(entity.key)) == Entity.pb(encode(entity)), entity.key


# -- the memory store's own promise, which the emulators keep by locking instead ------------


def test_the_memory_store_aborts_a_transaction_whose_read_moved():
    with ndb.Client(project="store-contract", credentials=AnonymousCredentials()).context():
        store = MemoryStore()
        store.insert(record())
        transaction = store.transaction()
        (found,) = transaction.get([record().key])
        store.update(record(attempt=2), found.version)  # another writer, between the read and the commit
        transaction.put(record(attempt=9))
        with pytest.raises(exceptions.Aborted):
            transaction.commit()
        assert store.lookup("r" * 64).record.attempt == 2


# -- the ledger on the memory store: the protocol's decisions, with no emulator -------------


def test_the_ledger_keeps_the_protocol_on_the_memory_store():
    with ndb.Client(project="store-contract", credentials=AnonymousCredentials()).context():
        memory = MemoryStore()
        clock = ManualClock()
        ledger = Ledger(clock, store=lambda: memory)
        policy = RunPolicy(lease_seconds=60, retention_seconds=3600)
        description = RunDescription("scheduler", "nightly")

        first = ledger.replay_or_claim("run", description, policy)
        assert isinstance(first, Claimed) and first.attempt.fence is not None  # the fast path
        assert isinstance(ledger.replay_or_claim("run", description, policy), InProgress)
        clock.advance(61)
        second = ledger.replay_or_claim("run", description, policy)  # a takeover
        assert isinstance(second, Claimed) and second.attempt.number == 2
        assert isinstance(ledger.complete_run(first.attempt, {"by": 1}, policy), Stale)
        assert isinstance(ledger.release_run(second.attempt, {"message": "busy"}), Released)
        third = ledger.replay_or_claim("run", description, policy)
        assert isinstance(third, Claimed) and third.attempt.number == 3
        assert isinstance(ledger.complete_run(third.attempt, {"by": 3}, policy), Finished)
        replay = Ledger(clock, store=lambda: memory).replay_or_claim("run", description, policy)
        assert isinstance(replay, Replayed) and replay.record.result == {"by": 3}

        exclusive = RunPolicy(lease_seconds=60, retention_seconds=3600, exclusive=True)
        held = ledger.replay_or_claim("x1", description, exclusive)
        assert isinstance(held, Claimed)
        assert isinstance(ledger.replay_or_claim("x2", description, exclusive), Overlap)
        assert isinstance(ledger.complete_run(held.attempt, 1, exclusive), Finished)
        assert isinstance(ledger.replay_or_claim("x2", description, exclusive), Claimed)  # the lock went
