"""Compacted catch-up: one run stands for a Scheduler job's slots that never ran (a resume's
``catch_up: compact``, the audit's ``misfire: compact``, ``catch_up_after_exclusion: compact``).

The newest such slot (N) runs, under its own key, standing for the others.  The ledger is the
one truth of what it stands for, in three steps, each a transaction:

1. N's record is set to stand for the others' times (``Ledger.stand_for``): released, no attempt
   begun, so whoever claims N next (the dispatched task, an operator, a retry) takes the list.
2. Each other slot is recorded covered: skipped, naming N (``compacted_into``), by
   ``Ledger.skip_runs``, which reads each record first (a slot a delivery claimed meanwhile is
   not covered) and N's too (once N has begun, nothing more is covered into it).
3. N's run is dispatched.  Its attempt, once it holds N, reads which of the listed slots name
   it (service.runs): exactly those, since none can be covered after it began.

A covered slot is final: a late delivery of it, or an operator's run, is answered from its record
(a duplicate), never run.  Nothing is ever uncovered: if the queue refuses N's task, the slots
stay covered into N, N stays to run (missed or paused, so it alerts and can be run by hand,
taking them all), and a resume sent again dispatches it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from dedup.claims import ClaimRequest, RunDescription
from dedup.keys import format_utc
from dispatch import Dispatched, DispatchError
from models import RunSource
from schedules.bound import BoundJob
from schedules.metrics import Outcome, Source, count
from schedules.slots import Slot
from service.slots import external_of, slot_key, slot_run_work, spread_seconds
from service.state import AppState

log = logging.getLogger(__name__)

# The most slots one compacted run stands for: a day of minutes seven times over.  The run's task
# carries their times (about 30 bytes each, well inside Cloud Tasks' 1 MB), and covering them is
# COMMIT_BATCH writes a transaction, twenty at most.  Older slots are left as they are, and said.
COMPACT_MAX_SLOTS = 10_080


class CompactionRefused(ValueError):
    """A job compaction cannot serve: its own handler runs it, and is given no covered slots."""

    @classmethod
    def of(cls, job_id: str) -> CompactionRefused:
        return cls(
            f"{job_id} is run by its own handler, which cannot be given the slots a compacted run "
            "stands for: catch up with latest or all"
        )


@dataclasses.dataclass(frozen=True)
class Compacted:
    """What a compaction did: the run that stands for the slots (the newest slot's), its task
    (None: the queue refused it, ``error`` says why), the slots covered into it (``covered``:
    this compaction's, oldest first), those it could not cover (a delivery or an operator
    claimed them meanwhile: they keep their own status), and those past COMPACT_MAX_SLOTS, left
    as they are."""

    slot: Slot
    dispatched: Dispatched | None
    covered: list[Slot]
    not_covered: list[Slot]
    left: list[Slot]
    error: DispatchError | None = None


class NothingToCompact(Exception):
    """The newest slot's run began since it was read: there is no run left to stand for the others."""


def compact(
    state: AppState,
    requested_by: str,
    job: BoundJob,
    never_ran: Sequence[tuple[Slot, int]],
    source: Source = Source.SLOT_RUN,
    delay_seconds: float | None = None,
    counted: bool = True,
) -> Compacted:
    """Cover ``never_ran`` (oldest first, each with the attempt it was seen at) but the newest into
    the newest's run, and dispatch that run (see the module's steps).  The run waits
    ``delay_seconds`` (by default the job's spread).  A slot seen at an attempt (an exclusion
    window's skip) is covered in its place, as an operator's run reopens it.  ``counted``: count
    the covered slots ``covered`` (not when they were decided already: an exclusion window's
    are counted ``excluded``).  Raises
    CompactionRefused for an external job, NothingToCompact when the newest slot's run has begun."""
    if external_of(state, job.declared.target) is not None:
        raise CompactionRefused.of(job.declared.target)
    newest, seen = never_ran[-1]
    older = list(never_ran[:-1])
    taken_seen, left_seen = (older[-COMPACT_MAX_SLOTS:], older[:-COMPACT_MAX_SLOTS])
    taken, left = [slot for slot, _ in taken_seen], [slot for slot, _ in left_seen]
    policy = state.jobs[job.declared.target].policy
    if not state.ledger.stand_for(
        newest.run_id, _description(newest, job, requested_by), policy, [format_utc(s.schedule_time) for s in taken]
    ):
        raise NothingToCompact(newest.run_id)
    reason = f"compacted: the run of {format_utc(newest.schedule_time)} ({newest.run_id}) stands for this slot"
    claims = [
        ClaimRequest(
            slot.run_id,
            _description(slot, job, requested_by),
            policy,
            reopen_attempt=attempt,
            skip_reason=reason,
            covered_by=newest.run_id,
        )
        for slot, attempt in taken_seen
    ]
    written = {skipped.record.run_id for skipped in state.ledger.skip_runs(claims)}
    covered = [slot for slot in taken if slot.run_id in written]
    if counted:
        count(job.declared.name, job.declared.target, Outcome.COVERED, source, len(covered))
    work = slot_run_work(
        job.declared.target,
        newest,
        seen,
        requested_by,
        delay_seconds=spread_seconds(job.declared) if delay_seconds is None else delay_seconds,
    )
    not_covered = [slot for slot in taken if slot.run_id not in written]
    try:
        dispatched = state.dispatcher.dispatch(work)
    except DispatchError as error:
        log.warning("%d slots covered into %s wait for its run: %s", len(covered), newest.run_id, error)
        return Compacted(newest, None, covered, not_covered, left, error)
    return Compacted(newest, dispatched, covered, not_covered, left)


def _description(slot: Slot, job: BoundJob, requested_by: str) -> RunDescription:
    """The slot's run as its delivery would describe it (so a delivery's claim agrees with it)."""
    key = slot_key(slot)
    return RunDescription(
        source=RunSource.SCHEDULER,
        job_id=job.declared.target,
        scheduler_job_name=key.scheduler_job_name,
        schedule_time=slot.schedule_time,
        project=key.project,
        location=key.location,
        requested_by=requested_by,
    )
