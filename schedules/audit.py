"""The missed-execution audit: once per slot, an ERROR line for each slot that became ``missed``.

Each pass looks at the slots whose retry window closed since the previous
pass (per Scheduler job, remembered in an AuditMark), finds which have no
completed, failed or skipped run, and reports them.  The mark moves forward
in a transaction that only lands if no other pass moved it first, and the
lines are written after it lands: two passes at once report a slot once.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from google.cloud import ndb

from dedup.keys import format_utc
from dedup.ledger import Ledger
from dedup.transactions import run_transaction
from models.audit import AuditMark
from schedules.config import SchedulerJob
from schedules.slots import MAX_SLOTS, Slot, Status, execution_status, slots_between

log = logging.getLogger("dedup.audit")
# A first pass (no mark yet: a new Scheduler job, the first deploy) starts from now, so it never
# reports a day of "missed" slots that were never expected of this app; later passes start
# where the last stopped.
AUDIT_PATIENCE_SECONDS = 10
MICROSECOND = datetime.timedelta(microseconds=1)


@dataclasses.dataclass(frozen=True)
class MissedSlot:
    slot: Slot

    def document(self) -> dict[str, str]:
        return {
            "job_id": self.slot.job.target,
            "scheduler_job": self.slot.job.name,
            "schedule_time": format_utc(self.slot.schedule_time),
            "run_id": self.slot.run_id,
        }


def mark_id(job: SchedulerJob) -> str:
    return f"{job.project}/{job.location}/{job.name}"


def audit(ledger: Ledger, jobs: tuple[SchedulerJob, ...]) -> list[MissedSlot]:
    """One pass over every Scheduler job; the slots found missed, each logged once at ERROR."""
    now = ledger.clock.now()
    missed: list[MissedSlot] = []
    for job in jobs:
        missed += _audit_job(ledger, job, now)
    return missed


def _audit_job(ledger: Ledger, job: SchedulerJob, now: datetime.datetime) -> list[MissedSlot]:
    key = ndb.Key(AuditMark, mark_id(job))
    mark = key.get()
    window = Slot(job, now).window_closes - now
    checked_until = mark.checked_until if mark else now
    # The slots whose window closed in [checked_until, now): scheduled a window earlier.
    slots = slots_between([job], checked_until - window, now - window, MAX_SLOTS)
    through = now if len(slots) < MAX_SLOTS else slots[-1].schedule_time + window + MICROSECOND
    records = ledger.lookup_many([slot.run_id for slot in slots])
    statuses = [execution_status(s, records.get(s.run_id), now) for s in slots]
    # A run still holding a live lease past its window (a long lease, a heartbeat) may yet be
    # missed: stop the mark before it, and report only what lies before it.
    pending = [s for s, status in zip(slots, statuses, strict=True) if status == Status.IN_PROGRESS]
    if pending:
        through = min(through, pending[0].schedule_time + window)
    found = [
        MissedSlot(s)
        for s, status in zip(slots, statuses, strict=True)
        if status == Status.MISSED and s.schedule_time + window < through
    ]

    def advance() -> bool:
        current = key.get()
        if current is not None and current.checked_until == through:
            return True  # this pass's own commit, landed although its answer was lost
        if (current.checked_until if current else None) != (mark.checked_until if mark else None):
            return False  # another pass got here first: it reports these slots
        AuditMark(key=key, checked_until=through).put()
        return True

    if not run_transaction(advance, AUDIT_PATIENCE_SECONDS):
        return []
    for slot in found:
        log.error(
            "execution of %s at %s was missed: no run completed, failed or was skipped, and no retry can come",
            slot.slot.job.name,
            format_utc(slot.slot.schedule_time),
            extra={**slot.document(), "outcome": "missed"},
        )
    return found
