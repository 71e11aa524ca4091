"""Compacted catch-up: one run stands for a Scheduler job's slots that never ran (a resume's
``catch_up: compact``, the audit's ``misfire: compact``).

The newest such slot runs, under its own key, given the times of the others (``covers``).  Each
of the others is first recorded as skipped, naming that run (``compacted_into``): written in
transactions that read each record first, so a slot a delivery claimed meanwhile is never
covered, and a covered slot is never run on its own.  A later delivery of a covered slot finds
its record and is answered from it, a duplicate; an operator's run of it likewise.  Covering
comes before the dispatch, and a dispatch the queue refuses uncovers them.  A catch-up sent
again (its answer lost) finds the slots it covered, still pointing at the newest slot's run,
and dispatches that run again with all of them, which the queue refuses as it has it (the
same task id).
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


@dataclasses.dataclass(frozen=True)
class Compacted:
    """What a compaction did: the run that stands for the slots (the newest slot, dispatched),
    the slots it covers (``covered``: oldest first, this compaction's and an earlier one's),
    those it could not (a delivery or an operator claimed them meanwhile: they keep their own
    status), and those past COMPACT_MAX_SLOTS, left as they are."""

    slot: Slot
    dispatched: Dispatched
    covered: list[Slot]
    not_covered: list[Slot]
    left: list[Slot]


def compact(
    state: AppState,
    requested_by: str,
    job: BoundJob,
    never_ran: Sequence[tuple[Slot, int]],
    covered_before: Sequence[Slot] = (),
    source: Source = Source.SLOT_RUN,
    delay_seconds: float | None = None,
) -> Compacted:
    """Cover ``never_ran`` (oldest first, each with the attempt it was seen at) but the newest,
    and dispatch the newest's run given every slot it covers, ``covered_before`` included (slots
    an earlier compaction covered into that same run).  Raises DispatchError when the queue does
    not take the run (the covering stands: sent again, it is dispatched with them), and
    CompactionRefused for an external job.  The run waits ``delay_seconds`` (by default the job's
    spread), and a slot seen at an attempt (a skipped one: an exclusion window's) is covered in
    its place, as an operator's run reopens it."""
    if external_of(state, job.declared.target) is not None:
        raise CompactionRefused(
            f"{job.declared.target} is run by its own handler, which cannot be given the slots a compacted run "
            "stands for: catch up with latest or all"
        )
    newest, seen = never_ran[-1]
    older = list(never_ran[:-1])
    room = max(0, COMPACT_MAX_SLOTS - len(covered_before))
    taken_seen, left_seen = (older[-room:], older[:-room]) if room else ([], older)
    taken, left = [slot for slot, _ in taken_seen], [slot for slot, _ in left_seen]
    policy = state.jobs[job.declared.target].policy
    reason = f"compacted: the run of {format_utc(newest.schedule_time)} ({newest.run_id}) stands for this slot"
    claims = [
        ClaimRequest(
            slot.run_id,
            RunDescription(
                source=RunSource.SCHEDULER,
                job_id=job.declared.target,
                scheduler_job_name=(key := slot_key(slot)).scheduler_job_name,
                schedule_time=slot.schedule_time,
                project=key.project,
                location=key.location,
                requested_by=requested_by,
            ),
            policy,
            reopen_attempt=attempt,
            skip_reason=reason,
            covered_by=newest.run_id,
        )
        for slot, attempt in taken_seen
    ]
    written = {skipped.record.run_id for skipped in state.ledger.skip_runs(claims)}
    covered_now = [slot for slot in taken if slot.run_id in written]
    covered = sorted([*covered_before, *covered_now], key=lambda slot: slot.schedule_time)
    work = slot_run_work(
        job.declared.target,
        newest,
        seen,
        requested_by,
        delay_seconds=spread_seconds(job.declared) if delay_seconds is None else delay_seconds,
        covers=[format_utc(slot.schedule_time) for slot in covered],
    )
    try:
        dispatched = state.dispatcher.dispatch(work)
    except DispatchError:
        # No run will stand for them: they are uncovered, and stay missed or paused as they were.
        # (Should this fail too, they stay covered into the newest slot's run, which a catch-up
        # sent again finds and dispatches with them.)
        try:
            state.ledger.withdraw_skips([slot.run_id for slot in covered], newest.run_id)
        except Exception:
            log.exception(
                "%d slots covered into %s stay covered: its run was not dispatched", len(covered), newest.run_id
            )
        raise
    count(job.declared.name, job.declared.target, Outcome.COVERED, source, len(covered_now))
    return Compacted(newest, dispatched, covered, [s for s in taken if s.run_id not in written], left)
