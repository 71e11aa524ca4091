"""The slot outcomes the service decides (schedules/metrics.py counts them): a slot's run that
finished.  A pause's slots its resume left are counted by schedules.metrics.count_left_paused;
the audit counts the rest."""

from __future__ import annotations

import datetime

from dedup.keys import ScheduledRunKey
from dedup.outcomes import Finished, RunOutcome, Skipped
from models import RunSource
from schedules.config import SchedulerJob
from schedules.metrics import Source, count_run
from schedules.slots import Slot, execution_status


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
