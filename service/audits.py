"""Audit passes: a pass split in shares a task each, and what the audit does of its own accord
(the misfire policy's catch-up)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from dedup.keys import format_utc
from dispatch import Dispatched, DispatchError, Work, task_id
from schedules.attention import Share, forget_share, members_of, note_share, shares_of
from schedules.audit import AuditPass, audit
from schedules.config import SchedulerJob, history_id
from schedules.metrics import Source
from schedules.pauses import current
from schedules.slots import Slot
from service.compaction import compact
from service.pauses import failure_streak_pause
from service.slots import external_of, slot_run_work, spread_seconds
from service.state import AppState

log = logging.getLogger(__name__)


AUDIT_SHARE_TASK = "/tasks/audit-share"  # the endpoint a dispatched share of an audit pass calls

# The Scheduler jobs one request audits.  A pass over 1,000 takes about 7 s at a 10 ms round trip
# (bench/fleet.py), far inside App Engine's 10-minute request timeout; a larger fleet (Cloud
# Scheduler allows 5,000 jobs a region, and one app may serve several regions) is split.
AUDIT_SHARE_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class AuditShare:
    """Scheduler jobs of one pass audited by a task of their own: ``count`` from ``first``, in
    scheduler.yaml's order.  ``dispatched`` is None where the queue could not take it."""

    first: str
    count: int
    dispatched: Dispatched | None

    def document(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "count": self.count,
            "task_id": self.dispatched.task_id if self.dispatched else None,
            "already_dispatched": bool(self.dispatched and self.dispatched.already),
        }


def split_audit(state: AppState, jobs: Sequence[SchedulerJob]) -> tuple[tuple[SchedulerJob, ...], list[AuditShare]]:
    """The first AUDIT_SHARE_SIZE Scheduler jobs, for this request to audit, and the rest
    dispatched in shares of that size (``/tasks/audit-share``).

    A share names its first job's key and a count, not every key: its task stays small
    whatever the names.  If a deploy changes the file before a share runs, it may audit a
    job twice or leave one to the next pass; both are harmless, since each job's mark says
    what it has already judged.  The task id holds the pass's minute, so cron's retry of the
    same pass is refused by the queue; a share the queue refused outright is audited by the
    next pass, whose slots it has not judged yet."""
    pass_minute = format_utc(state.clock.now().replace(second=0, microsecond=0))
    shares = []
    for start in range(AUDIT_SHARE_SIZE, len(jobs), AUDIT_SHARE_SIZE):
        share = jobs[start : start + AUDIT_SHARE_SIZE]
        body = {"first": share[0].key, "count": len(share)}
        work = Work(task_id("audit-share", pass_minute, share[0].key, str(len(share))), AUDIT_SHARE_TASK, body)
        dispatched: Dispatched | None
        try:
            dispatched = state.dispatcher.dispatch(work)
        except DispatchError:
            log.exception("%d Scheduler jobs from %s wait for the next audit pass", len(share), share[0].key)
            dispatched = None
        shares.append(AuditShare(share[0].key, len(share), dispatched))
    return tuple(jobs[:AUDIT_SHARE_SIZE]), shares


def audit_share(jobs: Sequence[SchedulerJob], first: str, count: int) -> tuple[SchedulerJob, ...] | None:
    """The ``count`` Scheduler jobs from the one declared as ``first``; None if none is."""
    keys = [job.key for job in jobs]
    if first not in keys:
        return None
    start = keys.index(first)
    return tuple(jobs[start : start + count])


MISFIRE_PRINCIPAL = "misfire-policy"  # requested_by of a run the audit's misfire policy dispatched


def misfire_catch_up(state: AppState) -> Callable[[Slot], bool]:
    """The audit's catch-up (schedules.audit.CatchUp): dispatch a missed slot to run under its key."""

    def dispatch_slot(slot: Slot) -> bool:
        # Never raises: the audit's mark has moved, and its lines must still be written.
        try:
            record = state.ledger.lookup(slot.run_id)
            seen = record.attempt if record else 0
            external = external_of(state, slot.job.target)
            work = slot_run_work(
                slot.job.target,
                slot,
                seen,
                MISFIRE_PRINCIPAL,
                external=external,
                delay_seconds=spread_seconds(slot.job),
            )
            state.dispatcher.dispatch(work)
        except Exception:
            log.warning("the misfire policy could not dispatch %s: reported as missed", slot.run_id, exc_info=True)
            return False
        return True

    return dispatch_slot


def misfire_compact(state: AppState) -> Callable[[list[Slot]], list[Slot]]:
    """The audit's compaction (schedules.audit.Compact): the newest missed slot's run, dispatched,
    standing for the others (service.compaction); the slots it took."""

    def compact_slots(slots: list[Slot]) -> list[Slot]:
        # Never raises: the audit's mark has moved, and its lines must still be written.
        try:
            job = slots[-1].bound
            assert job is not None  # the audit judges bound jobs' slots
            records = state.ledger.lookup_many([slot.run_id for slot in slots])
            never_ran = [(slot, records[slot.run_id].attempt if slot.run_id in records else 0) for slot in slots]
            done = compact(state, MISFIRE_PRINCIPAL, job, never_ran, source=Source.AUDIT)
        except Exception:
            log.warning("the misfire policy could not compact %d slots: reported as missed", len(slots), exc_info=True)
            return []
        # Covered, they are never missed; the newest is, until its run is dispatched (by hand, if
        # the queue refused it: it takes every slot covered into it).
        return [*done.covered, *([done.slot] if done.dispatched is not None else [])]

    return compact_slots


AFTER_EXCLUSION_PRINCIPAL = "exclusion-window"  # requested_by of a run an ended window's catch-up dispatched


def after_exclusion(state: AppState) -> Callable[[list[Slot], str, float], list[Slot]]:
    """The audit's catch-up after an exclusion window (schedules.audit.AfterExclusion): the
    window's newest slot (``latest``), or one run of it standing for the others (``compact``),
    dispatched to run when the window ends; the slots it took."""

    def run_window(slots: list[Slot], mode: str, wait: float) -> list[Slot]:
        # Never raises: the audit's mark has moved, and its lines must still be written.
        try:
            job = slots[-1].bound
            assert job is not None  # the audit judges bound jobs' slots
            records = state.ledger.lookup_many([slot.run_id for slot in slots])
            seen = [(slot, records[slot.run_id].attempt if slot.run_id in records else 0) for slot in slots]
            delay = wait + spread_seconds(job.declared)
            if mode == "compact":
                done = compact(  # its slots were counted excluded: decided, not counted again
                    state, AFTER_EXCLUSION_PRINCIPAL, job, seen, source=Source.AUDIT, delay_seconds=delay, counted=False
                )
                return [*done.covered, *([done.slot] if done.dispatched is not None else [])]
            newest, attempt = seen[-1]
            external = external_of(state, job.declared.target)
            work = slot_run_work(
                job.declared.target, newest, attempt, AFTER_EXCLUSION_PRINCIPAL, external=external, delay_seconds=delay
            )
            state.dispatcher.dispatch(work)
        except Exception:
            log.warning("the slots of an ended exclusion window were not run: they stay excluded", exc_info=True)
            return []
        return [newest]

    return run_window


def audit_shares(jobs: Sequence[SchedulerJob]) -> list[Share]:
    """The shares a pass splits ``jobs`` into (scheduler.yaml's order): what a page reads the
    attention of (schedules.attention)."""
    return shares_of(jobs, AUDIT_SHARE_SIZE)


def audit_jobs(state: AppState, jobs: Sequence[SchedulerJob]) -> AuditPass:
    """One audit of ``jobs`` (a pass's own share, or a dispatched one): with their pauses, the
    misfire policy's catch-up and the failure-streak pause.  Where ``jobs`` is one of the pass's
    shares as scheduler.yaml now splits it, what the pass judged of each job's attention is
    written for the pages (schedules.attention); a share the file no longer splits so is not."""
    members = members_of([history_id(job) for job in jobs])
    share = next((s for s in audit_shares(state.schedules) if s.members == members), None)
    pauses_read_at = state.clock.now()
    bound = tuple(state.with_pauses(jobs))
    try:
        found = audit(
            state.ledger,
            bound,
            misfire_catch_up(state),
            failure_streak_pause(state),
            misfire_compact(state),
            after_exclusion(state),
        )
    except Exception:
        if share is not None:  # some marks may have moved: the share's entity would hide them
            _forget(state, share)
        raise
    if share is not None:
        if found.contended:  # another pass judged some of them later: it writes what it knows
            _forget(state, share)
        else:
            paused = [history_id(job.declared) for job in bound if current(job.pauses) is not None]
            try:
                note_share(state.ledger.store(), share, found.attention, paused, pauses_read_at)
            except Exception:  # the pass is done and reported: pages ask the index instead
                log.exception("the attention of %d Scheduler jobs from %s was not written", share.count, share.first)
                _forget(state, share)
    return found


def _forget(state: AppState, share: Share) -> None:
    try:
        forget_share(state.ledger.store(), share)
    except Exception:  # then the entity ages out of FRESH_SECONDS
        log.exception("the attention of %d Scheduler jobs from %s could not be forgotten", share.count, share.first)
