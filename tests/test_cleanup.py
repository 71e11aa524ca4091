"""The cleanup task deletes exactly the expired records, even run twice at once."""

from __future__ import annotations

import datetime
import threading

import pytest
import yaml
from google.cloud import ndb

from models import RunRecord, RunStatus
from tests.support.deliveries import JOBS

# The cleanup's deletes are fenced on versions where the fence is verified, and transactions elsewhere.
pytestmark = pytest.mark.both_emulators

UTC = datetime.UTC


def make_records(clock, count, *, expired, status=RunStatus.COMPLETED, live_lease=False, prefix="r"):
    now = clock.now()
    expire_at = now - datetime.timedelta(seconds=1) if expired else now + datetime.timedelta(hours=1)
    lease = now + datetime.timedelta(minutes=5) if live_lease else now - datetime.timedelta(minutes=5)
    return [
        RunRecord(
            id=f"{prefix}-{index}",
            source="scheduler",
            job_id="invoice",
            status=status.value,
            attempt_id="a",
            attempt=1,
            lease_expires=lease,
            expire_at=expire_at,
            created=now - datetime.timedelta(days=8),
            updated=now,
        )
        for index in range(count)
    ]


@pytest.fixture
def seeded(make_client, ndb_client, clock):
    client = make_client(JOBS)
    with ndb_client.context():
        records = (
            make_records(clock, 1000, expired=True, prefix="old")
            + make_records(clock, 300, expired=False, prefix="fresh")
            + make_records(clock, 5, expired=False, status=RunStatus.IN_PROGRESS, live_lease=True, prefix="running")
            # Never expected (a live lease keeps expire_at ahead), but never deleted either.
            + make_records(clock, 3, expired=True, status=RunStatus.IN_PROGRESS, live_lease=True, prefix="odd")
        )
        for start in range(0, len(records), 400):
            ndb.put_multi(records[start : start + 400])
    return client


def remaining_ids(ndb_client):
    with ndb_client.context():
        return {key.id().split("-")[0] for key in RunRecord.query().fetch(keys_only=True)}, RunRecord.query().count()


@pytest.mark.slow
def test_cleanup_deletes_exactly_the_expired_records(seeded, ndb_client):
    response = seeded.get("/tasks/cleanup", status=200)
    assert response.json["deleted"] == 1000 and response.json["more"] is False
    prefixes, count = remaining_ids(ndb_client)
    assert prefixes == {"fresh", "running", "odd"} and count == 308


@pytest.mark.slow
def test_two_cleanups_at_once_are_safe(seeded, ndb_client):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(seeded.get("/tasks/cleanup", status=200).json)) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sum(r["deleted"] for r in results) == 1000
    assert remaining_ids(ndb_client)[1] == 308


def test_cron_yaml_calls_the_cleanup_task():
    with open("cron.yaml") as handle:
        jobs = yaml.safe_load(handle)["cron"]
    assert any(job["url"] == "/tasks/cleanup" for job in jobs)


@pytest.mark.slow
def test_records_that_must_stay_never_stall_the_batches_behind_them(make_client, ndb_client, clock):
    client = make_client(JOBS)
    with ndb_client.context():
        ndb.put_multi(
            make_records(clock, 150, expired=True, status=RunStatus.IN_PROGRESS, live_lease=True, prefix="a-odd")
        )
        ndb.put_multi(make_records(clock, 10, expired=True, prefix="z-old"))
    assert client.get("/tasks/cleanup", status=200).json["deleted"] == 10
    assert remaining_ids(ndb_client) == ({"a"}, 150)


@pytest.mark.slow
def test_many_batches_in_flight_at_once_delete_each_record_once(make_client, ndb_client, clock):
    """Issue 26 §4: the batches' lookups and deletes run beside the query for the next batch."""
    from dedup import queries

    make_client(JOBS)
    with ndb_client.context():
        for start in range(0, 2100, 300):
            ndb.put_multi(make_records(clock, 300, expired=True, prefix=f"b{start}"))
        done = queries.clean_up(clock.now, budget_seconds=60, batch_size=100, workers=4)
    assert (done.deleted, done.batches, done.more) == (2100, 21, False)
    assert remaining_ids(ndb_client) == (set(), 0)


def test_a_spent_budget_stops_after_the_batch_in_hand_and_says_there_is_more(make_client, ndb_client, clock):
    from dedup import queries

    make_client(JOBS)
    with ndb_client.context():
        ndb.put_multi(make_records(clock, 30, expired=True, prefix="x"))
        done = queries.clean_up(clock.now, budget_seconds=0, batch_size=10)
        assert (done.deleted, done.batches, done.more) == (10, 1, True)
        rest = queries.clean_up(clock.now, budget_seconds=60, batch_size=10)
    assert (rest.deleted, rest.more) == (20, False)


def test_a_record_written_since_it_was_read_is_not_deleted(make_client, ndb_client, clock):
    """The delete is fenced on the version read: a claim that took the expired record since keeps it."""
    from dedup import queries
    from dedup.record_store import RecordStore

    make_client(JOBS)
    with ndb_client.context():
        ndb.put_multi(make_records(clock, 3, expired=True, prefix="y"))
        store = RecordStore.of_context()
        keys = [ndb.Key(RunRecord, f"y-{i}") for i in range(3)]
        read = store.lookup_many(keys)
        taken = RunRecord.get_by_id("y-1")
        taken.attempt_id, taken.expire_at = "b", clock.now() + datetime.timedelta(days=7)
        taken.put()  # claimed afresh between the cleanup's read and its delete
        assert store.delete_unchanged([found for found in read if found is not None]) == 2
        assert RunRecord.get_by_id("y-1").attempt_id == "b"
        assert queries.delete_expired_keys(store, keys, clock.now) == 0  # nothing expired is left
