"""Issue 37 §3: an audit pass at fleet size moves its marks in batched commits.

A pass was a transaction per Scheduler job (two round trips each: 10,000 for 5,000 jobs every
15 minutes).  Now it judges every job, then moves the marks COMMIT_BATCH to a transaction, each
mark landing only if no other pass moved it since it was read.
"""

from __future__ import annotations

import datetime
import math

import pytest
from google.cloud import ndb

from dedup.ledger import Ledger
from dedup.transactions import COMMIT_BATCH, get_many
from devtools.rpc_counter import counting_client
from models.audit import AuditMark
from schedules.audit import audit, move_marks
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, history_id

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def fleet(count: int) -> tuple[BoundJob, ...]:
    return tuple(
        BoundJob(
            SchedulerJob(
                name=f"fleet-{n}",
                target="invoice",
                schedule="0 * * * *",
                project="acme-prod",
                location="us-central1",
                attempt_deadline=60,
            ),
            retention_seconds=7 * 86400,
            expected_from=T0,
        )
        for n in range(count)
    )


@pytest.mark.slow  # a fleet over one batch: a few seconds of emulator work
def test_a_pass_over_a_fleet_moves_its_marks_in_a_few_commits_and_reports_each_slot_once(datastore, clock):
    jobs = fleet(COMMIT_BATCH + 20)
    clock.advance((T0 + datetime.timedelta(hours=3) - clock.now()).total_seconds())
    client, counter = counting_client(datastore.project)
    with client.context():
        ledger = Ledger(clock)
        counter.wait_until_idle()
        counter.reset()
        found = audit(ledger, jobs)
        counter.wait_until_idle()
        commits = counter.snapshot().get("Commit", 0)
        again = audit(ledger, jobs)  # the same moment: every mark has moved past what it judged
    # 00:00, 01:00 and 02:00 of each job: their windows closed, nothing ran.
    assert len(found.missed) == 3 * len(jobs)
    assert len({(r.slot.job.name, r.slot.schedule_time) for r in found.missed}) == 3 * len(jobs)
    assert commits == math.ceil(len(jobs) / COMMIT_BATCH)  # one per batch of marks, not one per job
    assert again.reported == []


def test_in_a_batch_only_the_marks_no_other_pass_moved_land(datastore, ndb_client, clock):
    with ndb_client.context():
        keys = [ndb.Key(AuditMark, history_id(job.declared)) for job in fleet(4)]
        store = Ledger(clock).store()
        read = get_many(store, keys)  # none yet
        first = [(key, mark, T0, {}) for key, mark in zip(keys, read, strict=True)]
        assert move_marks(store, first[:2]) == set(keys[:2])  # another pass moves two of them
        later = T0 + datetime.timedelta(hours=1)
        # This pass read the four before the other moved two: only its two others land.
        assert move_marks(store, [(key, mark, later, {}) for key, mark, _, _ in first]) == set(keys[2:])
        marks = get_many(store, keys)
    assert [mark.checked_until for mark in marks] == [T0, T0, later, later]


def test_a_batch_that_fails_after_one_landed_leaves_the_landed_marks_reported(
    datastore, ndb_client, clock, monkeypatch
):
    """The next pass starts after every mark that moved: a pass that moved a batch and then failed
    must already have reported that batch's slots, or they are never reported."""
    import schedules.audit as audit_module

    jobs = fleet(5)
    clock.advance((T0 + datetime.timedelta(hours=2) - clock.now()).total_seconds())
    monkeypatch.setattr(audit_module, "COMMIT_BATCH", 2)  # three batches: 2, 2 and 1 jobs
    moved_by = audit_module.move_marks
    calls = []

    def second_batch_fails(store, moves):
        calls.append(len(moves))
        if len(calls) == 2:
            raise RuntimeError("Datastore unreachable past the patience")
        return moved_by(store, moves)

    monkeypatch.setattr(audit_module, "move_marks", second_batch_fails)
    reported = []
    monkeypatch.setattr(
        audit_module, "_report", lambda ledger, judged, *rest: reported.append(judged.job.declared.name)
    )
    with ndb_client.context(), pytest.raises(RuntimeError):
        audit(Ledger(clock), jobs)
    assert calls == [2, 2] and sorted(reported) == ["fleet-0", "fleet-1"]  # the first batch, reported
