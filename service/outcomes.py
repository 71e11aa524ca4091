"""The slot outcomes the service decides (schedules/metrics.py counts them): a slot's run that
finished, and a pause's slots its resume left not caught up.  The audit counts the rest."""

from __future__ import annotations

import datetime
import logging

from google.cloud import ndb

from dedup.keys import ScheduledRunKey
from dedup.outcomes import Finished, RunOutcome, Skipped
from dedup.transactions import get_many
from models import RunSource
from models.audit import AuditMark
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, history_id
from schedules.intervals import Pause
from schedules.metrics import Outcome, Source, count, count_run
from schedules.slots import ExecutionStatus, Slot, execution_status, slot_pages
from service.state import AppState

log = logging.getLogger(__name__)


def count_finish(
    declared: SchedulerJob | None,
    job_id: str,
    key: ScheduledRunKey,
    outcome: RunOutcome,
    now: datetime.datetime,
    source: Source,
) -> None:
    """A declared Scheduler job's slot decided by this run's finish: counted by the one request
    whose finish (or skip) was written, never by a replay, a 409 or a retry's release.  A Force
    run is no slot's."""
    record = outcome.record
    if declared is None or declared.target != job_id or key.force_run or record is None:
        return
    if not isinstance(outcome, Finished | Skipped) or record.source != RunSource.SCHEDULER:
        return
    status = execution_status(Slot(declared, key.schedule_time), record, now)  # excluded, where its skip was
    count_run(declared.name, status, record, source)


def count_left_paused(state: AppState, job: BoundJob, interval: Pause, caught_up: set[str]) -> None:
    """The slots of ``interval`` (a pause just ended) that the audit judged while it lasted (and so
    left to this resume) and that its catch-up (``caught_up``: their run ids) did not run: decided
    ``paused``.  Those the audit judges from now on it counts itself.  Never raises: the resume is
    done, and a count lost is a count short."""
    try:
        (mark,) = get_many(state.ledger.store(), [ndb.Key(AuditMark, history_id(job.declared))])
        if mark is None or interval.until is None:
            return
        now, left = state.clock.now(), 0
        for slots in slot_pages([job], interval.since, min(interval.until, mark.checked_until)):
            judged = [slot for slot in slots if slot.window_closes < mark.checked_until]
            records = state.ledger.lookup_many([slot.run_id for slot in judged])
            left += sum(
                1
                for slot in judged
                if slot.run_id not in caught_up
                and execution_status(slot, records.get(slot.run_id), now) == ExecutionStatus.PAUSED
            )
        count(job.declared.name, job.declared.target, Outcome.PAUSED, Source.RESUME, left)
    except Exception:
        log.warning("the paused slots %s's resume left were not counted", job.declared.name, exc_info=True)
