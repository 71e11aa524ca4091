"""Slot outcomes as metrics: what became of each slot, counted once, when it is decided.

A slot is decided by the finish of its run (ran once, ran after more attempts, failed, skipped:
``service.outcomes``, on the one attempt whose fenced finish landed), by the audit pass whose mark
landed (missed, stuck, conflict, late, and paused or excluded where no run can come:
schedules/audit.py), or by the resume whose catch-up went out (the paused slots it left:
``count_left_paused``, once a pause, marked on it; the audit counts them for a pause no resume
counted).  Each is counted there and nowhere else, so never per attempt and never
twice across instances; a slot an operator runs again later (a backfill, a reopened failure) is
decided again, and counted with its new outcome.  Duplicate deliveries absorbed are counted as
each is answered (schedules/tallies.py's count, outcome ``duplicate``).

Made with the OpenTelemetry API alone: handlers/metrics.py gives the process its provider and
exporter.  The labels are bounded by scheduler.yaml and jobs.yaml: the Scheduler job, the job,
the outcome and who decided it (``source``), never a run id.
"""

from __future__ import annotations

import datetime
import enum
import logging
from collections.abc import Mapping

from opentelemetry import metrics

from dedup.ledger import Ledger
from dedup.metrics import labels
from models import RunRecord
from schedules.bound import BoundJob
from schedules.intervals import Pause
from schedules.slots import ExecutionStatus, execution_status, ran_once_or_more_of, slot_pages

log = logging.getLogger(__name__)

meter = metrics.get_meter("dedup.slots")
# Where the metrics live in Cloud Monitoring (handlers/metrics.py writes them there; the dashboard
# and the alert policies of python -m deploy read them): workload.googleapis.com/dedup.slot.outcomes.
METRIC_TYPE_PREFIX = "workload.googleapis.com"
OUTCOMES_NAME = "dedup.slot.outcomes"
DELAY_NAME = "dedup.slot.schedule_delay"
DURATION_NAME = "dedup.slot.run_duration"
ATTEMPTS_NAME = "dedup.slot.attempts"
PROGRESS_AGE_NAME = "dedup.slot.progress_age"


def metric_type(name: str) -> str:
    """A metric's type in Cloud Monitoring."""
    return f"{METRIC_TYPE_PREFIX}/{name}"


class Outcome(enum.StrEnum):
    """The ``outcome`` label of ``dedup.slot.outcomes``: what a decided slot came to."""

    RAN_ONCE = "ran_once"  # completed at its first attempt
    RAN_AFTER_RETRIES = "ran_after_retries"  # completed at a later one (a takeover, a retry after a release)
    FAILED = "failed"  # failed for good (a permanent failure, after Scheduler's retries of released attempts)
    SKIPPED = "skipped"  # delivered later than its job's max_delay_seconds: not run
    MISSED = "missed"  # no run, and no retry can come
    STUCK = "stuck"  # an attempt started and never finished
    CONFLICT = "conflict"  # another job's run holds its key
    LATE = "late"  # completed after finish_within: counted beside its ran_once or ran_after_retries
    PAUSED = "paused"  # inside a pause, and not caught up
    EXCLUDED = "excluded"  # inside an exclusion window (scheduler.yaml's exclude:), not run
    COVERED = "covered"  # a compacted catch-up's run stands for it (counted when it is covered)
    DUPLICATE = "duplicate"  # a delivery of a slot already run or running, absorbed (per delivery)


class Source(enum.StrEnum):
    """The ``source`` label: what decided the slot."""

    SCHEDULER = "scheduler"  # a Cloud Scheduler delivery's run finished it (or was a duplicate)
    SLOT_RUN = "slot_run"  # a run of the slot by hand, a resume's catch-up or the misfire policy's
    AUDIT = "audit"  # the audit pass whose mark landed
    RESUME = "resume"  # the resume whose catch-up went out, leaving the slot of its pause not caught up


# What an execution status, once final, counts as (completed splits by attempts: ``outcome_of``).
_BY_STATUS: Mapping[str, Outcome] = {
    ExecutionStatus.FAILED: Outcome.FAILED,
    ExecutionStatus.SKIPPED: Outcome.SKIPPED,
    ExecutionStatus.MISSED: Outcome.MISSED,
    ExecutionStatus.STUCK: Outcome.STUCK,
    ExecutionStatus.CONFLICT: Outcome.CONFLICT,
    ExecutionStatus.LATE: Outcome.LATE,
    ExecutionStatus.PAUSED: Outcome.PAUSED,
    ExecutionStatus.EXCLUDED: Outcome.EXCLUDED,
    ExecutionStatus.COVERED: Outcome.COVERED,
}

OUTCOMES = meter.create_counter(
    OUTCOMES_NAME, unit="{slot}", description="slots decided, by Scheduler job, job, outcome and source"
)
# Seconds: from a second to a day; attempts: the first few.
_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)
DELAY = meter.create_histogram(
    DELAY_NAME,
    unit="s",
    description="a slot's run: its first claim minus the slot's time",
    explicit_bucket_boundaries_advisory=_SECONDS,
)
DURATION = meter.create_histogram(
    DURATION_NAME,
    unit="s",
    description="a slot's run: the finishing attempt's start to its finish",
    explicit_bucket_boundaries_advisory=_SECONDS,
)
ATTEMPTS = meter.create_histogram(
    ATTEMPTS_NAME,
    unit="{attempt}",
    description="a slot's run: the attempts it took",
    explicit_bucket_boundaries_advisory=(1.0, 2.0, 3.0, 5.0, 10.0),
)


# Written by every audit pass for each Scheduler job it judged: seconds since the newest slot
# that made progress.  A daily or weekly job's forward progress is watched on it (a threshold),
# since a metric absence waits 23.5 hours at most; and its absence says the audit has stopped.
PROGRESS_AGE = meter.create_gauge(
    PROGRESS_AGE_NAME,
    unit="s",
    description="seconds since the newest slot that ran (or was excluded or covered), as the audit judged",
)
# What counts as forward progress: a slot that ran, or one planned not to (excluded, covered).
PROGRESS_STATUSES = (ExecutionStatus.COMPLETED, ExecutionStatus.EXCLUDED, ExecutionStatus.COVERED)


def note_progress_age(scheduler_job: str, job_id: str, seconds: float) -> None:
    PROGRESS_AGE.set(max(0.0, seconds), labels(job_id, scheduler_job, Source.AUDIT))


def outcome_of(status: str, attempt: int | None) -> Outcome | None:
    """What a slot of this final status counts as; None for one still to be decided (due,
    upcoming, in progress, released, overdue) or never expected (untracked, unknown)."""
    if status == ExecutionStatus.COMPLETED:
        once, _ = ran_once_or_more_of([(status, attempt)])
        return Outcome.RAN_ONCE if once else Outcome.RAN_AFTER_RETRIES
    return _BY_STATUS.get(status)


def count(scheduler_job: str, job_id: str, outcome: Outcome, source: Source, slots: int = 1) -> None:
    """``slots`` slots of ``scheduler_job`` decided as ``outcome`` by ``source``."""
    if slots:
        OUTCOMES.add(slots, {**labels(job_id, scheduler_job, source), "outcome": str(outcome)})


def count_left_paused(ledger: Ledger, job: BoundJob, interval: Pause, caught_up: set[str], source: Source) -> int:
    """Count ``paused`` the slots of the ended pause ``interval`` left to its resume, and not run
    by its catch-up (``caught_up``: their run ids): those whose retry window closed before the
    pause ended (the audit judges the later ones, and counts them itself).  How many; never
    raises: the resume or the pass is done, and a count lost is a count short."""
    if interval.until is None:
        return 0
    try:
        now, left = ledger.clock.now(), 0
        # Past the job's retention no record can say a slot never ran (it is unknown, not paused).
        horizon = now - datetime.timedelta(seconds=job.retention_seconds) if job.retention_seconds else interval.since
        for slots in slot_pages([job], max(interval.since, horizon), interval.until):
            judged = [slot for slot in slots if slot.window_closes < interval.until and slot.run_id not in caught_up]
            records = ledger.lookup_many([slot.run_id for slot in judged])
            left += sum(
                1 for slot in judged if execution_status(slot, records.get(slot.run_id), now) == ExecutionStatus.PAUSED
            )
        count(job.declared.name, job.declared.target, Outcome.PAUSED, source, left)
        return left
    except Exception:
        log.warning("the paused slots %s's pause left were not counted", job.declared.name, exc_info=True)
        return 0


def count_run(scheduler_job: str, status: str, record: RunRecord, source: Source) -> None:
    """A slot decided by its run's finish (``status``: the slot's, as every view gives it): its
    outcome, and for a run that ran, its delay, duration and attempts."""
    outcome = outcome_of(status, record.attempt)
    if outcome is None:
        return
    count(scheduler_job, record.job_id, outcome, source)
    if outcome in (Outcome.SKIPPED, Outcome.EXCLUDED, Outcome.COVERED) or record.schedule_time is None:
        return  # nothing ran
    attributes = labels(record.job_id, scheduler_job, source)
    DELAY.record(max(0.0, (record.created - record.schedule_time).total_seconds()), attributes)
    if record.started is not None and record.finished is not None:
        DURATION.record(max(0.0, (record.finished - record.started).total_seconds()), attributes)
    ATTEMPTS.record(record.attempt, attributes)
