"""Runs: a scheduled delivery's run, and a manual run under a client token.

``run_delivery`` is a Cloud Scheduler delivery: ``delivered_key`` and ``late_delivery`` decide
what it is (a slot's, a Force run) and whether it came too late, ``run_scheduled`` runs it (or an
operator's run of a slot) once under its key, and what its answer leaves to do comes back as
data.  ``run_manually`` runs a job once per client token; ``run_manually_later`` answers it from
its record or queues it, by ``answer_or_queue``, the one rule of every queued action.  Each
takes the app's state and the principal it acts for as parameters.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import ndb

from dedup.claims import INSTANCE, REOPENED, RunDescription, RunPolicy
from dedup.clock import Clock
from dedup.idempotency import FINISHED_TOKEN_LIFETIME_SECONDS, TOKEN_LIFETIME_SECONDS, IdempotencyGuard, fingerprint
from dedup.keys import ScheduledRunKey, format_utc, is_run_id, parse_rfc3339, scheduled_run_key
from dedup.outcomes import Attempt, Claimed, Finished, InProgress, Replayed, RunOutcome, Skipped
from dedup.runner import Waiting, run_once
from dispatch import Dispatched, Work, task_id
from jobs.base import ExternalTarget, RunContext
from jobs.config import JobSpec
from models import RunRecord, RunSource, RunStatus
from schedules.config import SchedulerJob, history_id, schedule_zone
from schedules.metrics import Outcome, Source, count
from schedules.pauses import Pause, pause_at, pauses_read
from schedules.slots import declared_job, force_run_reason, force_run_retry, may_be_force_run_retry
from schedules.summaries import NOTED, RunNote
from schedules.tallies import DuplicateDelivery, tally_after_answer
from service.errors import Declined, NotFound, RefusalKind
from service.outcomes import count_finish
from service.principal import Principal
from service.state import AppState

log = logging.getLogger(__name__)


def run_scheduled(
    state: AppState,
    principal: Principal,
    job_id: str,
    job: JobSpec,
    key: ScheduledRunKey,
    body: bytes,
    *,
    skip_reason: str | None = None,
    reopen_attempt: int | None = None,
    force_run: bool = False,
) -> RunOutcome:
    """Run a scheduled execution once under its key, for ``principal``: a delivery's path, and an
    operator's run of a slot.  ``force_run``: recorded as a Force run (its key may be its own).
    A compacted run (its record set to stand for other slots: service.compaction) gives the job
    the slots covered into it, read once its attempt holds the run."""
    source = RunSource.FORCE_RUN if force_run or key.force_run else RunSource.SCHEDULER
    description = RunDescription(
        source=source,
        job_id=job_id,
        scheduler_job_name=key.scheduler_job_name,
        schedule_time=key.schedule_time,
        project=key.project,
        location=key.location,
        requested_by=principal.name,
    )

    if job.runner.external is not None:  # its handler claims this key: answer from the record, never claim
        said = state.ledger.refusal(key.run_id, description, reopen_attempt=reopen_attempt)
        if said is None or isinstance(said, Claimed):  # nothing to answer from: a claim would take it
            raise runs_elsewhere(job_id, job.runner.external)
        return said

    def work(attempt: Attempt) -> Any:
        return job.runner.run(
            RunContext.for_attempt(
                attempt,
                job_id,
                source=source,
                scheduler_job_name=key.scheduler_job_name,
                schedule_time=key.schedule_time,
                body=body,
                project=key.project,
                location=key.location,
                clock=state.clock,
                covers=covered_into(state, key, attempt) if attempt.covers else (),
            )
        )

    return run_once(
        state.ledger, key.run_id, description, job.policy, work, skip_reason=skip_reason, reopen_attempt=reopen_attempt
    )


def covered_into(state: AppState, key: ScheduledRunKey, attempt: Attempt) -> tuple[datetime.datetime, ...]:
    """The slot times covered into the run ``attempt`` holds, of those it was set to stand for:
    the ones whose records name it (oldest first).  Read after the claim, when no more can be
    covered into it (Ledger.skip_runs), so exactly the slots that will never run on their own."""
    listed = {
        scheduled_run_key(
            key.scheduler_job_name, time, query_project=key.project, query_location=key.location
        ).run_id: parse_rfc3339(time, "covers")
        for time in attempt.covers or ()
    }
    records = state.ledger.lookup_many(list(listed))
    return tuple(
        sorted(when for run_id, when in listed.items() if (r := records.get(run_id)) and r.compacted_into == key.run_id)
    )


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A Scheduler delivery as it is run: its key, why it is a Force run (None: a slot's delivery),
    the declared Scheduler job it is of (None: none is), and that job's pause intervals."""

    key: ScheduledRunKey
    force_run: str | None
    declared: SchedulerJob | None
    pauses: list[Pause]


def delivered_key(state: AppState, job_id: str, key: ScheduledRunKey, now: datetime.datetime) -> Delivery:
    """The key a delivery runs under, why it is a Force run, and its Scheduler job's pauses.

    A Force run carrying a slot still to come is keyed apart (``ScheduledRunKey.as_force_run``),
    so it never takes that slot, and the slot's own delivery still runs the slot.  Its retries
    keep its schedule time and may come at any time after it, within the skew before the slot,
    at the slot or after: ``force_run_retry`` says which deliveries are its retries.  The Force
    run's record is read only where a retry of one may come, in one lookup with the pause
    intervals every delivery of a declared Scheduler job reads: no round trip more.
    """
    bound = state.bound_schedules
    found = force_run_reason(key, job_id, bound, now)
    of = declared_job(bound, key.scheduler_job_name, key.project, key.location)
    declared = of.declared if of is not None else None
    own = declared if declared is not None and declared.target == job_id else None
    forced_id = key.as_force_run().run_id if found is None and may_be_force_run_retry(key, own, now) else None
    # Both reads sent before either is waited for: NDB sends them in one lookup.
    read_pauses = pauses_read(declared) if declared is not None else None
    read_forced = RunRecord.get_by_id_async(forced_id) if forced_id is not None else None
    pauses = read_pauses() if read_pauses is not None else []
    forced = read_forced.result() if read_forced is not None else None
    if found is None and forced is not None and not forced.is_expired(now):
        found = force_run_retry(key, forced, own, now)
    if found is None:
        return Delivery(key, None, declared, pauses)
    return Delivery(key.as_force_run() if found.own_key else key, found.reason, declared, pauses)


def late_delivery(job: JobSpec, key: ScheduledRunKey, now: datetime.datetime, force_run: bool = False) -> str | None:
    """Why this delivery is too late to run (its job's max_delay_seconds), or None.

    A Force run is asked for now, whatever time it carries: never late."""
    if job.max_delay_seconds is None or force_run or key.force_run:
        return None
    delay = (now - key.schedule_time).total_seconds()
    if delay <= job.max_delay_seconds:
        return None
    return (
        f"delivered {delay:.0f}s after its schedule time, later than the job's max_delay_seconds "
        f"({job.max_delay_seconds:g}s): not run; an operator can run the slot by hand"
    )


def excluded_delivery(declared: SchedulerJob | None, key: ScheduledRunKey, force_run: bool = False) -> str | None:
    """Why this delivery is not run: its slot lies in an exclusion window of its Scheduler job
    (planned downtime), unless the job says run_excluded; None otherwise.  A Force run is asked
    for now, by someone: it runs."""
    if declared is None or force_run or key.force_run or declared.run_excluded:
        return None
    zone = schedule_zone(declared.time_zone)
    window = next((w for w in declared.exclude if w.covers(key.schedule_time, zone)), None)
    if window is None:
        return None
    return (
        f"excluded: the slot lies in an exclusion window of {declared.name} ({window.words()}): not run; "
        "run_excluded: true runs such deliveries, and an operator can run the slot by hand"
    )


@dataclasses.dataclass(frozen=True)
class DuplicateToCount:
    """A duplicate delivery of a declared Scheduler job's slot, absorbed: counted in its tally
    (``schedules.tallies``) once its answer has gone, never on its path, with the status it got."""

    scheduler_job: str  # the tally's Scheduler job (``history_id``)
    schedule_time: datetime.datetime
    received: datetime.datetime
    client: ndb.Client = dataclasses.field(repr=False, compare=False)  # the count's own NDB context's
    declared: SchedulerJob | None = None  # whose metric it is counted in (schedules.metrics)

    def count(self, status: int) -> None:
        if self.declared is not None:
            count(self.declared.name, self.declared.target, Outcome.DUPLICATE, Source.SCHEDULER)
        tally_after_answer(
            self.client, self.scheduler_job, self.schedule_time, DuplicateDelivery(self.received, INSTANCE, status)
        )


@dataclasses.dataclass(frozen=True)
class Delivered:
    """What a Scheduler delivery did, and the facts its answer carries or leaves behind: the
    outcome; the key it ran under and why it is a Force run (None: a slot's delivery); the pause
    it came during (it ran all the same); and, for a duplicate of a declared Scheduler job's
    slot, the count to make once the answer has gone (``duplicate``)."""

    outcome: RunOutcome
    key: ScheduledRunKey
    force_run: str | None
    paused: Pause | None
    duplicate: DuplicateToCount | None
    note: RunNote | None = None  # a finished run of a slot, for its day's summary once the answer has gone


def run_delivery(
    state: AppState,
    principal: Principal,
    job_id: str,
    job: JobSpec,
    key: ScheduledRunKey,
    body: bytes,
    keyed: Callable[[Delivery], None] = lambda delivery: None,
) -> Delivered:
    """Run a Cloud Scheduler delivery of ``job_id``: a slot's, or a Force run keyed apart
    (``delivered_key``), skipped when later than the job allows (``late_delivery``).
    ``keyed`` hears the key it runs under before it runs (the request's log line names it
    even if the run fails)."""
    now = state.clock.now()
    delivery = delivered_key(state, job_id, key, now)
    keyed(delivery)
    key, force_run = delivery.key, delivery.force_run
    if force_run:
        log.info("a Force run of %s: %s", key.scheduler_job_name, force_run)
    skip_reason = excluded_delivery(delivery.declared, key, force_run=bool(force_run)) or late_delivery(
        job, key, now, force_run=bool(force_run)
    )
    outcome = run_scheduled(
        state, principal, job_id, job, key, body, skip_reason=skip_reason, force_run=bool(force_run)
    )
    duplicate = None
    if delivery.declared is not None and not force_run and isinstance(outcome, Replayed | InProgress):
        client = ndb.get_context().client
        duplicate = DuplicateToCount(history_id(delivery.declared), key.schedule_time, now, client, delivery.declared)
    # A delivery during a pause (a tick racing it, a Force run) runs as usual, and says so.  A
    # Force run is asked for now; a slot's delivery belongs to its time.
    pause = pause_at(delivery.pauses, now if force_run else key.schedule_time)
    if pause is not None:
        log.info(
            "%s delivered while %s is paused (since %s, by %s): run as usual",
            "a Force run" if force_run else f"the slot {key.schedule_time_text}",
            key.scheduler_job_name,
            format_utc(pause.since),
            pause.paused_by,
            extra={"scheduler_job": key.scheduler_job_name, "schedule_paused": format_utc(pause.since)},
        )
    count_finish(delivery.declared, job_id, key, outcome, now, Source.SCHEDULER)
    note = run_note(delivery.declared, job_id, key, outcome, ndb.get_context().client)
    return Delivered(outcome, key, force_run, pause, duplicate, note)


def run_note(
    declared: SchedulerJob | None, job_id: str, key: ScheduledRunKey, outcome: RunOutcome, client: ndb.Client
) -> RunNote | None:
    """The day summary's note of a run that finished a declared Scheduler job's slot under the
    slot's own key (schedules.summaries), or None: nothing that a home row counts."""
    record = outcome.record
    if declared is None or declared.target != job_id or key.force_run or record is None:
        return None
    if not isinstance(outcome, Finished | Skipped) or record.status not in NOTED:
        return None
    return RunNote(history_id(declared), key.schedule_time, record, client)


def runs_elsewhere(job_id: str, external: ExternalTarget) -> Declined:
    """The refusal of a run this app was asked to do of an external job (its handler runs it)."""
    return Declined(
        RefusalKind.RUNS_ELSEWHERE,
        f"{job_id} is run by its own handler at {external.url}, not by this app: its slots are run through the "
        "dashboard's run this slot (a Cloud Tasks task to the handler, under the slot's key), and it takes no "
        "manual runs. Nothing was recorded",
        {"job_id": job_id, "url": external.url},
    )


MANUAL_RUN_NAMESPACE = "manual-run"


def job_named(state: AppState, job_id: str) -> JobSpec:
    """The job ``job_id`` names; NotFound, before anything is written, when the jobs file declares none."""
    job = state.jobs.get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r} is declared in the jobs file")
    return job


def manually_runnable(state: AppState, job_id: str) -> JobSpec:
    """``job_named``'s job, refused (RunsElsewhere) when its own handler runs it: a manual run has
    no Scheduler slot, and so no key the handler would run it under."""
    job = job_named(state, job_id)
    if job.runner.external is not None:
        raise runs_elsewhere(job_id, job.runner.external)
    return job


def manual_run_policy(job: JobSpec) -> RunPolicy:
    """The job's lease, heartbeat and run limit, with the client-token lifetime (ECS)."""
    return dataclasses.replace(
        job.policy,
        retention_seconds=TOKEN_LIFETIME_SECONDS,
        finished_retention_seconds=FINISHED_TOKEN_LIFETIME_SECONDS,
    )


@dataclasses.dataclass(frozen=True)
class ManualRunRequest:
    """A manual run as asked: its client token (given or generated) and its parameters."""

    client_token: str
    parameters: dict[str, Any]

    def context(self, attempt: Attempt, job_id: str, clock: Clock) -> RunContext:
        return RunContext.for_attempt(
            attempt,
            job_id,
            source=RunSource.API,
            parameters=self.parameters,
            client_token=self.client_token,
            clock=clock,
        )


def run_manually(
    state: AppState,
    principal: Principal,
    job_id: str,
    job: JobSpec,
    ask: ManualRunRequest,
    wait: Waiting | None = None,
) -> RunOutcome:
    """Run ``job`` once per client token, for ``principal``: the API's and the dashboard's one path."""
    if job.runner.external is not None:
        raise runs_elsewhere(job_id, job.runner.external)
    guard = IdempotencyGuard(state.ledger, MANUAL_RUN_NAMESPACE, manual_run_policy(job), RunSource.API)
    return guard.run(
        ask.client_token,
        lambda attempt: job.runner.run(ask.context(attempt, job_id, state.clock)),
        scope=job_id,
        parameters=ask.parameters,
        exclude=job.fingerprint_exclude,
        wait=wait,
        job_id=job_id,
        requested_by=principal.name,
    )


MANUAL_RUN_TASK = "/tasks/manual-run"  # the endpoint a dispatched manual run calls (handlers/tasks.py)


def manual_run_id(state: AppState, job_id: str, job: JobSpec, client_token: str) -> str:
    """The run id a manual run of ``job`` under ``client_token`` has: known before it starts."""
    return IdempotencyGuard(state.ledger, MANUAL_RUN_NAMESPACE, manual_run_policy(job), RunSource.API).run_id(
        client_token, scope=job_id
    )


def runs_of_token(state: AppState, client_token: str) -> list[RunRecord]:
    """The manual runs ``client_token`` names, a run per job at most: one batched lookup."""
    ids = [manual_run_id(state, job_id, job, client_token) for job_id, job in sorted(state.jobs.items())]
    found = state.ledger.lookup_many(ids)
    return [found[run_id] for run_id in ids if run_id in found]


def manual_run_work(
    state: AppState, job_id: str, job: JobSpec, ask: ManualRunRequest, requested_by: str, seen_attempt: int = 0
) -> Work:
    """A manual run dispatched to be done later (run_manually, under its client token).  The task
    id is its run id, the attempt seen (0: none) and the parameters' fingerprint, so the queue
    refuses the same request twice, a task delivered twice is one run, a released run sent again
    is new work, and a form resent with other parameters is not silently dropped: its task runs,
    and the token's one run takes whichever claims first (the other is refused as a conflict)."""
    # The run API's body (clientToken, parameters), with what the API reads from its URL and caller.
    body = {
        "job_id": job_id,
        "clientToken": ask.client_token,
        "parameters": ask.parameters,
        "requested_by": requested_by,
    }
    run_id = manual_run_id(state, job_id, job, ask.client_token)
    sent = fingerprint(ask.parameters, job.fingerprint_exclude)
    return Work(task_id("manual-run", run_id, str(seen_attempt), sent), MANUAL_RUN_TASK, body)


def starts_a_run(record: RunRecord | None, now: datetime.datetime, reopen_attempt: int | None = None) -> bool:
    """Whether asking for this run would start an attempt (and so is dispatched to the queue):
    no record, one released, one whose lease ran out, or one failed or skipped at
    ``reopen_attempt`` (a slot's run replacing the attempt the operator saw), never one covered
    into a compacted run.  Otherwise the record answers at once (done, running, already replaced,
    covered): nothing is queued."""
    if record is None or record.status == RunStatus.RELEASED:
        return True
    if record.compacted_into:
        return False  # covered: a compacted run stands for it, and the claim answers from it (final)
    if record.status in REOPENED:
        return bool(reopen_attempt == record.attempt)
    return record.status == RunStatus.IN_PROGRESS and not record.lease_is_live(now)


@dataclasses.dataclass(frozen=True)
class Queued:
    """A run dispatched to be done later: its run id, the attempt there was when it was queued
    (0: none; the run is queued until a later one starts), and the task (``already``: queued before)."""

    run_id: str
    seen_attempt: int
    dispatched: Dispatched


def answer_or_queue[Answer](
    state: AppState,
    run_id: str,
    record: RunRecord | None,
    answer: Callable[[], Answer],
    work: Callable[[int], Work],
    reopen_attempt: int | None = None,
) -> Answer | Queued:
    """The one rule of an action whose run is done by the queue: ``answer()`` from the run's record
    when asking would start no attempt (done, running, already replaced), else dispatch ``work(seen)``
    for the attempt seen.  A DispatchError (the queue did not take it) goes to the caller."""
    if not starts_a_run(record, state.clock.now(), reopen_attempt=reopen_attempt):
        return answer()
    seen = record.attempt if record else 0
    return Queued(run_id, seen, state.dispatcher.dispatch(work(seen)))


def run_manually_later(
    state: AppState, principal: Principal, job_id: str, job: JobSpec, ask: ManualRunRequest
) -> RunOutcome | Queued:
    """A manual run queued (the dashboard's Run now and Retry), or answered at once from its record
    (done, running, another form's): nothing is queued then."""
    if job.runner.external is not None:
        raise runs_elsewhere(job_id, job.runner.external)
    run_id = manual_run_id(state, job_id, job, ask.client_token)
    return answer_or_queue(
        state,
        run_id,
        state.ledger.lookup(run_id),
        lambda: run_manually(state, principal, job_id, job, ask),
        lambda seen: manual_run_work(state, job_id, job, ask, principal.name, seen),
    )


def retry_refusal(record: RunRecord, jobs: Mapping[str, JobSpec]) -> Declined | None:
    """Why ``record`` cannot be retried (None: it can): only a failed manual run of a job still
    declared is run again, with its parameters, under a new token."""
    if record.job_id not in jobs:
        message = f"the job {record.job_id!r} of this run is no longer declared in the jobs file"
    elif record.source != RunSource.API or record.status != RunStatus.FAILED:
        message = f"only a failed manual run can be retried; this run is a {record.status} {record.source} run"
    else:
        return None
    details = {"run_id": record.run_id, "job_id": record.job_id, "run_status": record.status, "source": record.source}
    return Declined(RefusalKind.RUN_NOT_RETRYABLE, message, details)


@dataclasses.dataclass(frozen=True)
class RetryOf:
    """A failed manual run to retry, and its job: the retry runs the job with the run's parameters."""

    failed: RunRecord
    job: JobSpec


def retry_of(state: AppState, run_id: str) -> RetryOf:
    """The run ``run_id`` names, to be retried: NotFound when there is none (or it expired),
    Declined when it may not be (``retry_refusal``)."""
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    if record is None:
        raise NotFound(f"no run {run_id} (or it has expired)")
    refused = retry_refusal(record, state.jobs)
    if refused is not None:
        raise refused
    return RetryOf(record, state.jobs[record.job_id])
