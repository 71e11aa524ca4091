"""dedup.record_store on the emulator: the record's two encodings agree, and each answer means one thing.

A record written by the hot path (the v1 API) reads back through NDB field for field, one
NDB wrote reads back through the hot path's decoder, and the entity each writes is the same
entity, down to which properties are indexed and which blobs are marked compressed: the
queries, the dashboard and the audit read through NDB whatever wrote the record.
"""

from __future__ import annotations

import datetime

import grpc
import pytest
from google.cloud import ndb
from google.cloud.datastore_v1.types import datastore as datastore_types
from google.cloud.datastore_v1.types.entity import Entity

from dedup import record_store
from dedup.record_store import RecordStore, decode, encode
from dedup.store import Aborted, Applied, Doubt, Exists, Refused, StaleVersion
from dedup.transactions import transact
from devtools.rpc_counter import intercepted_client
from models import RunRecord, RunStatus
from tests.support.lost_answers import FailedCall

# The protocol holds on both of Google's emulators (tests/conftest.py).
pytestmark = pytest.mark.both_emulators

T = datetime.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC)


def full_record(run_id: str = "a" * 64) -> RunRecord:
    """Every property of RunRecord set, with values that stress each encoding."""
    return RunRecord(
        id=run_id,
        source="scheduler",
        job_id="nightly",
        scheduler_job_name="nightly-0230",
        schedule_time=T,
        project="acme-prod",
        location="us-central1",
        client_token="tök-😀",
        scope="principal:alice",
        parameters={"n": 1, "text": "ünïcode 😀", "nested": [None, True, 1.5, {"": []}]},
        fingerprint="f" * 64,
        requested_by="user:alice@example.com",
        status=RunStatus.IN_PROGRESS.value,
        attempt_id="b" * 32,
        attempt=3,
        lease_expires=T + datetime.timedelta(seconds=60),
        expire_at=T + datetime.timedelta(days=7),
        created=T,
        updated=T + datetime.timedelta(microseconds=1),
        started=T,
        finished=None,
        downstream="projects/p/locations/l/workflows/w/executions/e",
        attempts=[{"attempt": 3, "attempt_id": "b" * 32, "started": "2030-01-02T03:04:05.678901Z", "outcome": None}],
        result=0,  # a falsy result is a result
        error=None,
        preview="0",
    )


def sparse_record(run_id: str = "c" * 64) -> RunRecord:
    """Only what the model requires: every other property is null."""
    return RunRecord(
        id=run_id,
        source="api",
        job_id="j",
        status=RunStatus.COMPLETED.value,
        attempt_id="d" * 32,
        attempt=1,
        lease_expires=T,
        expire_at=T,
        created=T,
        updated=T,
    )


def fields(record: RunRecord | None) -> dict:
    assert record is not None
    return {"key": record.key, **record.to_dict()}


# Where Google's two emulators differ (docs/retention-and-cost.md, "Which emulator"): the legacy
# Datastore emulator refuses a mutation whose base_version is stale (conflict_detected), as the v1
# API's Mutation.base_version says; the Firestore emulator in Datastore mode applies it and reports
# no conflict.  Production's Firestore backend is checked at start-up (dedup/fence_probe.py).
REFUSES_STALE = {"legacy": True, "firestore": False}
# The Firestore emulator's commit of a transaction its Lookup began times out on that read's own
# lock, so there a transaction is begun by BeginTransaction (dedup/fence_check.py, begins_in_read).
BEGINS = {"legacy": {}, "firestore": {"BeginTransaction": 1}}


@pytest.fixture
def store(datastore, ndb_client):
    with ndb_client.context():
        yield RecordStore.of_context()


@pytest.mark.parametrize("make", [full_record, sparse_record])
def test_a_record_the_hot_path_writes_reads_back_through_ndb_field_for_field(store, make):
    record = make()
    assert isinstance(store.insert(record), Applied)
    assert fields(RunRecord.get_by_id(record.run_id)) == fields(record)
    assert fields(decode(encode(record))) == fields(record)


@pytest.mark.parametrize("make", [full_record, sparse_record])
def test_a_record_ndb_writes_reads_back_through_the_hot_path_and_is_the_same_entity(store, make):
    record = make()
    record.put()
    found = store.lookup(record.run_id)
    assert found is not None and found.version > 0
    assert fields(found.record) == fields(record)
    written_by_ndb = raw_entity(record.run_id)
    assert written_by_ndb == Entity.pb(encode(record))  # indexing and meanings included


def raw_entity(run_id: str):
    """The entity as stored, straight from the transport (no decoding of ours)."""
    client = ndb.get_context().client
    request = datastore_types.LookupRequest(
        project_id=client.project, keys=[record_store.key_pb(ndb.Key(RunRecord, run_id))]
    )
    response = client.stub.lookup(request)
    return Entity.pb(response.found[0].entity)


def test_what_the_hot_path_writes_is_found_by_the_queries_on_indexed_properties(store):
    record = full_record()
    store.insert(record)
    assert RunRecord.query(RunRecord.expire_at <= T + datetime.timedelta(days=8)).fetch(keys_only=True) == [record.key]
    assert RunRecord.query(RunRecord.job_id == "nightly", RunRecord.status == "in_progress").count() == 1


def test_an_insert_of_a_taken_key_is_refused_and_changes_nothing(store):
    first, second = full_record(), full_record()
    second.attempt_id = "e" * 32
    assert isinstance(store.insert(first), Applied)
    assert store.insert(second) == Exists()
    assert RunRecord.get_by_id(first.run_id).attempt_id == first.attempt_id


def test_an_update_fenced_on_an_old_version_is_not_applied(store, datastore_flavor):
    record = full_record()
    first = store.insert(record)
    assert isinstance(first, Applied)
    record.attempt = 4
    renewed = store.update(record, first.version)
    assert isinstance(renewed, Applied) and renewed.version > first.version
    record.attempt = 5  # a writer who still holds the first version
    stale = store.update(record, first.version)
    if not REFUSES_STALE[datastore_flavor]:  # the difference, recorded: applied
        assert isinstance(stale, Applied) and RunRecord.get_by_id(record.run_id).attempt == 5
        return
    assert stale == StaleVersion()
    assert RunRecord.get_by_id(record.run_id).attempt == 4
    found = store.lookup(record.run_id)
    assert found is not None and found.version == renewed.version


def test_a_lookup_and_an_insert_together_claim_a_fresh_record_or_find_the_one_there(store):
    record = full_record()
    found, written = store.lookup_and_insert(record)
    assert isinstance(written, Applied)
    assert found is None or found.record.attempt_id == record.attempt_id  # the two race: it may see its own
    again = full_record()
    again.attempt_id = "e" * 32
    found, written = store.lookup_and_insert(again)
    assert written == Exists() and found is not None and found.record.attempt_id == record.attempt_id


def test_a_record_an_ndb_put_overwrote_is_a_conflict_for_its_old_version(store, datastore_flavor):
    record = full_record()
    written = store.insert(record)
    assert isinstance(written, Applied)
    taken = RunRecord.get_by_id(record.run_id)
    taken.attempt_id, taken.attempt = "e" * 32, 4  # NDB writes it (a takeover on the transactional path)
    taken.put()
    if not REFUSES_STALE[datastore_flavor]:
        assert isinstance(store.update(record, written.version), Applied)
        return
    assert store.update(record, written.version) == StaleVersion()
    assert RunRecord.get_by_id(record.run_id).attempt_id == "e" * 32


def test_a_write_that_changes_nothing_keeps_the_version_and_fences_nobody(store):
    """Checked on the emulator: the version moves only when the entity does.  Every write of
    the ledger changes the entity (its attempt id, its lease or its ``updated``), and one
    that would not changes nothing a fence protects."""
    record = full_record()
    written = store.insert(record)
    assert isinstance(written, Applied)
    RunRecord.get_by_id(record.run_id).put()  # the same entity again
    assert store.lookup(record.run_id).version == written.version
    assert isinstance(store.update(record, written.version), Applied)


class Failing(grpc.UnaryUnaryClientInterceptor):
    """Answers every Commit with ``code``, after it landed or without sending it, as Datastore can."""

    def __init__(self, code: grpc.StatusCode, after_sending: bool) -> None:
        self.code, self.after_sending = code, after_sending

    def intercept_unary_unary(self, continuation, details, request):
        if not details.method.endswith("/Commit"):
            return continuation(details, request)
        if self.after_sending:
            continuation(details, request).result()  # it lands; its answer is lost
        return FailedCall(self.code, "injected")


@pytest.mark.parametrize(
    ("code", "after_sending", "meaning"),
    [
        (grpc.StatusCode.ABORTED, False, Aborted),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, Doubt),
        (grpc.StatusCode.UNAVAILABLE, False, Doubt),
        (grpc.StatusCode.UNAVAILABLE, True, Doubt),
        (grpc.StatusCode.INTERNAL, True, Doubt),
        (grpc.StatusCode.UNKNOWN, True, Doubt),
    ],
)
def test_each_error_of_a_commit_has_one_meaning(datastore, code, after_sending, meaning):
    client = intercepted_client(datastore.project, Failing(code, after_sending))
    with client.context():
        assert isinstance(RecordStore.of_context().insert(full_record()), meaning)
        landed = RunRecord.get_by_id(full_record().run_id)
    assert (landed is not None) == after_sending  # a Doubt may have landed; an Aborted never did


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.RESOURCE_EXHAUSTED,  # production's quota or capacity; no emulator produces it
        grpc.StatusCode.NOT_FOUND,  # an update of a record deleted since it was read
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
    ],
)
def test_every_other_error_is_a_refusal_never_raised(datastore, code):
    """Nothing on a fenced path raises a Datastore status to the request: the ledger settles a
    refusal in the transaction that reads the record (tests/test_fault_matrix.py)."""
    client = intercepted_client(datastore.project, Failing(code, False))
    with client.context():
        written = RecordStore.of_context().insert(full_record())
        assert isinstance(written, Refused) and written.error.grpc_status_code == code
        assert RunRecord.get_by_id(full_record().run_id) is None


def test_a_commit_retried_after_an_abort_names_the_transaction_that_aborted(datastore, datastore_flavor):
    """A pessimistic database queues the retry where the first try stood (previous_transaction)."""
    sent = []

    class Watch(grpc.UnaryUnaryClientInterceptor):
        aborted = 0

        def intercept_unary_unary(self, continuation, details, request):
            if details.method.endswith("/Lookup") and "new_transaction" in request.read_options:
                sent.append(request.read_options.new_transaction.read_write.previous_transaction)
            if details.method.endswith("/BeginTransaction"):
                sent.append(request.transaction_options.read_write.previous_transaction)
            if details.method.endswith("/Commit") and self.aborted < 2:
                self.aborted += 1
                return abort(continuation, details, request)
            return continuation(details, request)

    def body(transaction):
        transaction.get([ndb.Key(RunRecord, "p" * 64)])
        transaction.put(full_record("p" * 64))

    with intercepted_client(datastore.project, Watch()).context():
        _, transaction = transact(body, 5, RecordStore.of_context())
    assert len(sent) == 3
    assert sent[0] == b"" and sent[1] and sent[2] and sent[1] != sent[2]  # each retry names the try before
    assert transaction.began and transaction.began not in sent


def abort(continuation, details, request):
    """The commit aborted, as Datastore reports contention: nothing written, the transaction over
    (sent with no mutations, so a pessimistic database frees the locks its reads took)."""
    empty = datastore_types.CommitRequest.pb(datastore_types.CommitRequest(request))
    del empty.mutations[:]
    continuation(details, datastore_types.CommitRequest.wrap(empty)).result()
    return FailedCall(grpc.StatusCode.ABORTED, "injected contention")


class AbortFirstCommits(grpc.UnaryUnaryClientInterceptor):
    """Aborts the next ``count`` commits: contention, as Datastore reports it."""

    def __init__(self, count: int) -> None:
        self.count = count

    def intercept_unary_unary(self, continuation, details, request):
        if details.method.endswith("/Commit") and self.count > 0:
            self.count -= 1
            return abort(continuation, details, request)
        return continuation(details, request)


def test_a_transaction_is_begun_by_its_read_and_tried_again_when_aborted(datastore, datastore_flavor):
    from devtools.rpc_counter import RpcCounter

    counter = RpcCounter()
    aborts = AbortFirstCommits(2)

    class Both(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            return counter.intercept_unary_unary(
                lambda d, r: aborts.intercept_unary_unary(continuation, d, r), details, request
            )

    client = intercepted_client(datastore.project, Both())
    runs = []

    def body(transaction):
        (found,) = transaction.get([ndb.Key(RunRecord, full_record().run_id)])
        runs.append(found)
        transaction.put(full_record())
        return "done"

    with client.context():
        result, transaction = transact(body, 5, RecordStore.of_context())
        assert result == "done" and len(runs) == 3 and runs == [None, None, None]  # tried in three transactions
        assert transaction.versions[full_record().key] > 0
        counter.wait_until_idle()
        # Each begun by its Lookup; an aborted commit ends its transaction, so none is rolled back.
        begun = {name: 3 * count for name, count in BEGINS[datastore_flavor].items()}
        assert counter.snapshot() == {"Lookup": 3, "Commit": 3, **begun}
        assert fields(RunRecord.get_by_id(full_record().run_id)) == fields(full_record())


def test_a_transaction_that_writes_nothing_is_rolled_back_not_committed(datastore, datastore_flavor):
    from devtools.rpc_counter import counting_client

    client, counter = counting_client(datastore.project)
    with client.context():
        result, _ = transact(lambda t: t.get([ndb.Key(RunRecord, "x" * 64)]), 5, RecordStore.of_context())
    assert result == [None]
    counter.wait_until_idle()
    assert counter.snapshot() == {"Lookup": 1, "Rollback": 1, **BEGINS[datastore_flavor]}


def test_patience_runs_out_as_the_error(datastore):
    from google.api_core import exceptions

    client = intercepted_client(datastore.project, AbortFirstCommits(1000))

    def body(transaction):
        transaction.get([ndb.Key(RunRecord, "y" * 64)])
        transaction.put(full_record("y" * 64))

    with client.context(), pytest.raises(exceptions.Aborted):
        transact(body, 0.2, RecordStore.of_context())


def test_in_one_commit_a_mutation_on_an_old_version_is_refused_alone(store, datastore_flavor):
    """Why a run with a job's lock is written in transactions: a version fences one entity, not a
    commit.  (Checked on the emulator; docs/retention-and-cost.md says so.)"""
    first, second = full_record("a" * 64), full_record("b" * 64)
    one, two = store.insert(first), store.insert(second)
    assert isinstance(one, Applied) and isinstance(two, Applied)
    first.attempt = second.attempt = 9
    transaction = store.transaction()
    transaction._mutations = [
        datastore_types.Mutation(update=encode(first), base_version=one.version),
        datastore_types.Mutation(update=encode(second), base_version=two.version - 1),  # an old version
    ]
    transaction._puts = [first.key, second.key]
    transaction.commit()
    assert RunRecord.get_by_id(first.run_id).attempt == 9  # applied
    # Refused alone on the legacy emulator; both applied on the Firestore one (the reference table).
    assert RunRecord.get_by_id(second.run_id).attempt == (3 if REFUSES_STALE[datastore_flavor] else 9)


@pytest.mark.parametrize("record_current, lock_current", [(True, True), (False, True), (True, False), (False, False)])
def test_an_update_with_a_fenced_delete_lands_each_on_its_own_version(
    store, datastore_flavor, record_current, lock_current
):
    """A finish under a job's lock: the record's update and the lock's delete, in one commit, each
    fenced on its own version.  Each lands exactly when its version is current (dedup.fences says
    why every combination is safe); the answer is the record's."""
    from dedup.job_lock import JobLock

    record = full_record("e" * 64)
    inserted = store.insert(record)
    lock = JobLock(id="nightly", run_id=record.run_id, attempt_id=record.attempt_id, lease_expires=T)
    transaction = store.transaction()
    transaction.put(lock)
    transaction.commit()
    lock_version = transaction.versions[lock.key]
    assert isinstance(inserted, Applied)
    record.status = RunStatus.COMPLETED.value
    answer = store.update(
        record,
        inserted.version if record_current else inserted.version - 1,
        delete=(lock.key, lock_version if lock_current else lock_version - 1),
    )
    refuses = REFUSES_STALE[datastore_flavor]  # elsewhere every mutation lands: the path is the transaction's
    assert isinstance(answer, Applied if record_current or not refuses else StaleVersion)
    assert RunRecord.get_by_id(record.run_id).status == (
        RunStatus.COMPLETED if record_current or not refuses else RunStatus.IN_PROGRESS
    )
    assert (JobLock.get_by_id("nightly") is None) == (lock_current or not refuses)


def test_an_identical_rewrite_after_a_fenced_update_keeps_the_version_too(store):
    """The hot path's update goes out as NDB's writes do, so an NDB put of what it wrote is the same entity."""
    record = full_record("f" * 64)
    inserted = store.insert(record)
    record.attempt = 4
    updated = store.update(record, inserted.version)
    assert isinstance(updated, Applied)
    RunRecord.get_by_id(record.run_id).put()
    assert store.lookup(record.run_id).version == updated.version


def test_a_lookup_of_many_batches_sends_them_in_waves_and_answers_in_order(datastore, monkeypatch):
    """Outside a transaction the batches go LOOKUP_WAVE at a time: every key answered in the order
    asked, absent ones as None, in as many Lookups as batches."""
    from devtools.rpc_counter import counting_client

    monkeypatch.setattr(record_store, "LOOKUP_KEYS", 3)
    monkeypatch.setattr(record_store, "LOOKUP_WAVE", 2)
    client, counter = counting_client(datastore.project)
    with client.context():
        store = RecordStore.of_context()
        for n in range(4):
            record = full_record()
            record.key = ndb.Key(RunRecord, f"present-{n}")
            assert isinstance(store.insert(record), Applied)
        keys = [ndb.Key(RunRecord, f"{'present' if n % 3 == 0 else 'absent'}-{n // 3}") for n in range(11)]
        counter.wait_until_idle()
        counter.reset()
        found = store.lookup_many(keys)
        counter.wait_until_idle()
    assert [None if f is None else f.record.key.id() for f in found] == [
        key.id() if key.id().startswith("present") else None for key in keys
    ]
    assert counter.snapshot() == {"Lookup": 4}  # 11 keys in batches of 3, sent two at a time
