"""dedup/claims.py, the protocol's pure decisions, as a table: no emulator, no network.

Each row is a stored record (or none), the job's lock, and a claim; and what the claim must
decide: a refusal that writes nothing (Replayed, Conflict, JobMismatch, InProgress, Overlap),
or the record it writes (Claimed with its attempt number and adopted downstream, Skipped).
The ledger applies these decisions on both of its paths (an insert or fenced update, or a
transaction that reads first), so this table is what both do.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup.claims import ClaimRequest, RunDescription, RunPolicy, record_end, refusal
from dedup.job_lock import JobLock
from dedup.outcomes import Claimed, Conflict, InProgress, JobMismatch, Overlap, Replayed, Skipped
from models import RunRecord, RunStatus

NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
MINUTE = datetime.timedelta(minutes=1)
POLICY = RunPolicy(lease_seconds=60, retention_seconds=3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="nightly", fingerprint="f1")


@pytest.fixture(autouse=True)
def offline_context():
    """NDB builds keys in a context; this one's client never calls out (nothing here reads or writes)."""
    client = ndb.Client(project="claims-table", credentials=AnonymousCredentials())
    with client.context():
        yield


def stored(status: RunStatus, **fields) -> Callable[[], RunRecord]:
    """A record as the ledger leaves it (attempt 2, leased until a minute from now, kept for an
    hour), built when a test asks: NDB makes keys only in a context."""
    values = {
        "source": "scheduler",
        "job_id": "nightly",
        "fingerprint": "f1",
        "status": status.value,
        "attempt_id": "a" * 32,
        "attempt": 2,
        "lease_expires": NOW + MINUTE,
        "expire_at": NOW + 60 * MINUTE,
        "created": NOW - 10 * MINUTE,
        "attempts": [{"attempt": 2, "attempt_id": "a" * 32, "outcome": None}],
        **fields,
    }
    return lambda: RunRecord(id="run", **values)


def lock(run_id: str, held: bool) -> Callable[[], JobLock]:
    expires = NOW + (MINUTE if held else -MINUTE)
    return lambda: JobLock(id="nightly", run_id=run_id, attempt_id="l" * 32, lease_expires=expires)


def built(thunk):
    return thunk() if thunk is not None else None


# (name, stored record, lock, claim's changes) -> (outcome type, attempt number it claims or None)
ROWS = [
    ("nothing stored: claimed afresh", None, None, {}, Claimed, 1),
    ("completed: replayed", stored(RunStatus.COMPLETED), None, {}, Replayed, None),
    ("failed: replayed", stored(RunStatus.FAILED), None, {}, Replayed, None),
    ("skipped: replayed", stored(RunStatus.SKIPPED), None, {}, Replayed, None),
    ("in progress, lease live: 409 until it ends", stored(RunStatus.IN_PROGRESS), None, {}, InProgress, None),
    (
        "in progress, lease ended: taken over",
        stored(RunStatus.IN_PROGRESS, lease_expires=NOW - MINUTE),
        None,
        {},
        Claimed,
        3,
    ),
    (
        "in progress, lease ends this instant: taken over",
        stored(RunStatus.IN_PROGRESS, lease_expires=NOW),
        None,
        {},
        Claimed,
        3,
    ),
    ("released: claimed again at once", stored(RunStatus.RELEASED), None, {}, Claimed, 3),
    ("expired, whatever its status: absent", stored(RunStatus.COMPLETED, expire_at=NOW), None, {}, Claimed, 3),
    ("another job's run under this key", stored(RunStatus.COMPLETED, job_id="other"), None, {}, JobMismatch, None),
    ("other parameters, finished", stored(RunStatus.COMPLETED, fingerprint="f0"), None, {}, Conflict, None),
    ("other parameters, running", stored(RunStatus.IN_PROGRESS, fingerprint="f0"), None, {}, Conflict, None),
    ("other parameters, released: replaced", stored(RunStatus.RELEASED, fingerprint="f0"), None, {}, Claimed, 3),
    ("failed, reopened at the attempt seen", stored(RunStatus.FAILED), None, {"reopen_attempt": 2}, Claimed, 3),
    ("skipped, reopened at the attempt seen", stored(RunStatus.SKIPPED), None, {"reopen_attempt": 2}, Claimed, 3),
    ("failed, reopened at an older attempt", stored(RunStatus.FAILED), None, {"reopen_attempt": 1}, Replayed, None),
    ("completed is never reopened", stored(RunStatus.COMPLETED), None, {"reopen_attempt": 2}, Replayed, None),
    ("late, nothing stored: skipped", None, None, {"skip_reason": "late"}, Skipped, None),
    (
        "late, released with nothing downstream: skipped",
        stored(RunStatus.RELEASED),
        None,
        {"skip_reason": "late"},
        Skipped,
        None,
    ),
    (
        "late, released after starting downstream: claimed to finish it",
        stored(RunStatus.RELEASED, downstream="ops/1"),
        None,
        {"skip_reason": "late"},
        Claimed,
        3,
    ),
    (
        "late, a lease that ended: taken over, not skipped",
        stored(RunStatus.IN_PROGRESS, lease_expires=NOW - MINUTE),
        None,
        {"skip_reason": "late"},
        Claimed,
        3,
    ),
    ("late, completed: replayed", stored(RunStatus.COMPLETED), None, {"skip_reason": "late"}, Replayed, None),
    ("overlap forbid: another run holds the job", None, lock("other-run", True), {"exclusive": True}, Overlap, None),
    ("overlap forbid: this run's own lock", None, lock("run", True), {"exclusive": True}, Claimed, 1),
    ("overlap forbid: another run's lock ran out", None, lock("other-run", False), {"exclusive": True}, Claimed, 1),
    (
        "overlap forbid: a finished run replays before the lock is asked",
        stored(RunStatus.COMPLETED),
        lock("other-run", True),
        {"exclusive": True},
        Replayed,
        None,
    ),
]


def claim_of(changes: dict) -> ClaimRequest:
    policy = dataclasses.replace(POLICY, exclusive=changes.get("exclusive", False))
    return ClaimRequest(
        "run",
        DESCRIPTION,
        policy,
        reopen_attempt=changes.get("reopen_attempt"),
        skip_reason=changes.get("skip_reason"),
        attempt_id="n" * 32,
    )


@pytest.mark.parametrize(("name", "current", "job_lock", "changes", "kind", "number"), ROWS, ids=[r[0] for r in ROWS])
def test_every_decision_of_a_claim(name, current, job_lock, changes, kind, number):
    current, job_lock = built(current), built(job_lock)
    decided = claim_of(changes).decide(current, NOW, job_lock)
    assert type(decided) is kind, decided
    if kind is Claimed:
        record = decided.record
        assert decided.attempt.number == number == record.attempt
        assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "n" * 32)
        assert record.lease_expires == NOW + MINUTE and record.expire_at >= record.lease_expires
        live = current if current is not None and not current.is_expired(NOW) else None
        assert decided.attempt.downstream == (live.downstream if live else None)  # adopted, never invented
        assert record.attempts[-1]["attempt_id"] == "n" * 32 and record.attempts[-1]["outcome"] is None
        if current is not None and current.status == RunStatus.IN_PROGRESS:
            assert record.attempts[-2]["outcome"] == "lease_expired"  # the takeover is on the record
    elif kind is Skipped:
        record = decided.record
        assert record.status == RunStatus.SKIPPED and record.error["type"] == "LateDelivery"
        assert record.attempt == (current.attempt if current else 0)  # attempt numbers never go back
        assert record.attempt_id != "n" * 32  # no attempt holds a skipped run
    elif kind is InProgress:
        assert decided.retry_after_seconds == 60
    elif kind is Overlap:
        assert (decided.holder_run_id, decided.retry_after_seconds) == ("other-run", 60)


def test_a_refusal_is_the_same_whichever_path_asks():
    """The fast path asks ``refusal`` of the record it looked up; the transaction asks ``decide``."""
    for _, stored_record, _lock, changes, kind, _ in ROWS:
        current = built(stored_record)
        claim = claim_of(changes)
        live = current if current is not None and not current.is_expired(NOW) else None
        refused = refusal(live, DESCRIPTION, NOW, claim.reopen_attempt)
        if kind in (Replayed, Conflict, JobMismatch, InProgress):
            assert type(refused) is kind
        elif kind is Claimed:
            assert refused is None


def test_a_claim_finds_its_own_landed_write_and_no_other():
    claim = claim_of({})
    mine = stored(RunStatus.IN_PROGRESS, attempt_id="n" * 32, attempt=3)()
    own = claim.own(mine)
    assert isinstance(own, Claimed) and own.attempt.number == 3 and own.attempt.attempt_id == "n" * 32
    assert claim.own(stored(RunStatus.IN_PROGRESS)()) is None and claim.own(None) is None


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.RELEASED])
def test_an_end_is_written_on_the_attempt_that_owned_the_run(status):
    record = stored(RunStatus.IN_PROGRESS, attempts=[{"attempt_id": "z"}, {"attempt_id": "a" * 32}])()
    record_end(record, status, {"n": 1}, NOW)
    assert record.status == status and record.finished == NOW
    assert record.attempts[0] == {"attempt_id": "z"}  # another attempt's entry untouched
    assert record.attempts[1]["outcome"] == status and record.attempts[1]["finished"].startswith("2030-01-01T12:00")
    assert (record.result if status == RunStatus.COMPLETED else record.error) == {"n": 1}
