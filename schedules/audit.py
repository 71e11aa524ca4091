"""The missed-execution audit: once per slot, an ERROR line for each slot that became ``missed``.

Each pass looks at the slots whose retry window closed since the previous
pass (per Scheduler job, remembered in an AuditMark), finds which have no
completed, failed or skipped run, and reports them; a slot whose key holds
another job's run (a ``conflict``: its own job never ran) is reported too.
A slot the ledger may have forgotten (``unknown``: the audit came later than
the job's retention) is not called missed: the pass says, in one WARNING,
how many it could not check.  The mark moves forward in a transaction that
only lands if no other pass moved it first, and the lines are written after
it lands: two passes at once report a slot once.  A pass judges every job first, then moves
their marks together, COMMIT_BATCH to a transaction: a fleet's pass is a few commits, not one
per Scheduler job.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import ndb

from dedup.keys import format_utc
from dedup.ledger import Ledger
from dedup.store import Store, Transaction
from dedup.transactions import COMMIT_BATCH, get_many, transact
from models import RunRecord
from models.audit import AuditMark
from schedules.bound import BoundJob
from schedules.config import AUDIT_INTERVAL_SECONDS, SchedulerJob, history_id, schedule_zone
from schedules.metrics import (
    PROGRESS_STATUSES,
    Outcome,
    Source,
    count,
    count_left_paused,
    note_progress_age,
    outcome_of,
)
from schedules.pauses import mark_counted
from schedules.slots import (
    MAX_SLOTS,
    NEEDS_ATTENTION,
    ExecutionStatus,
    Slot,
    execution_status,
    nearest_slots,
    shown_status,
    slot_pages,
    slots_between,
)
from schedules.summaries import JobSummaries, RunDigest, days_between, repairs_for, summaries_of

log = logging.getLogger("dedup.audit")
# A first pass (no mark yet: a new Scheduler job, the first deploy) starts from the time the job's
# (schedules.history: when the app first knew its schedule, or its start_at), else from now, so
# it never reports a day of "missed" slots that were never expected of this app; later passes
# start where the last stopped.
AUDIT_PATIENCE_SECONDS = 10
MICROSECOND = datetime.timedelta(microseconds=1)
DAY = datetime.timedelta(days=1)
# What a pass reports, one ERROR line per slot: missed (nothing ran), conflict (another job's run
# holds the key) and stuck (an attempt started, never finished, and no retry can take it over).
REPORTED = (ExecutionStatus.MISSED, ExecutionStatus.CONFLICT, ExecutionStatus.STUCK)
LOG_OUTCOMES = {
    ExecutionStatus.MISSED: "missed",
    ExecutionStatus.CONFLICT: "job_mismatch",
    ExecutionStatus.STUCK: "stuck",
}


@dataclasses.dataclass(frozen=True)
class ReportedSlot:
    """A slot the audit reports: ``missed`` (nothing ran), ``conflict`` (another job's run holds
    its key) or ``stuck`` (its attempt started and never finished)."""

    slot: Slot
    status: ExecutionStatus = ExecutionStatus.MISSED

    def document(self) -> dict[str, str]:
        return {
            "job_id": self.slot.job.target,
            "scheduler_job": self.slot.job.name,
            "schedule_time": format_utc(self.slot.schedule_time),
            "run_id": self.slot.run_id,
            "status": self.status,
        }


@dataclasses.dataclass
class AuditPass:
    """What one pass found: the slots it reports, and how many it could not check (``unknown``)."""

    reported: list[ReportedSlot] = dataclasses.field(default_factory=list)
    caught_up: list[Slot] = dataclasses.field(default_factory=list)  # missed, and run by the misfire policy
    breaches: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # late, overdue, slow, failing
    unverified: int = 0
    # Each judged job's attention_until by history id (None: none), of the jobs whose marks this
    # pass moved: what its share's entity says (schedules.attention), so a page finds the jobs to
    # put first without a query.  ``contended``: another pass moved some of the marks first, and
    # judged them later than this one did.
    attention: dict[str, datetime.datetime | None] = dataclasses.field(default_factory=dict)
    contended: bool = False

    @property
    def missed(self) -> list[ReportedSlot]:
        return [found for found in self.reported if found.status == ExecutionStatus.MISSED]

    @property
    def conflicts(self) -> list[ReportedSlot]:
        return [found for found in self.reported if found.status == ExecutionStatus.CONFLICT]

    @property
    def stuck(self) -> list[ReportedSlot]:
        return [found for found in self.reported if found.status == ExecutionStatus.STUCK]


# Runs a missed slot the job's misfire policy names (dispatched, under the slot's key): True when
# the work was taken, False when it could not be (then the slot is reported missed as usual).
CatchUp = Callable[[Slot], bool]
# Pauses a Scheduler job, with a note saying why (a failure streak); True when it was paused.
Pause = Callable[[SchedulerJob, str], bool]
# Runs the newest of a job's missed slots standing for the others (misfire: compact): the slots it
# took (the newest and those it covered; none when the run could not be dispatched).
Compact = Callable[[list[Slot]], list[Slot]]
# Runs an ended exclusion window's slots as the job's catch_up_after_exclusion says (latest,
# compact): the window's excluded slots (oldest first), the mode, and how long the run waits (until
# the window ends); the slots it took (none when the run could not be dispatched).
AfterExclusion = Callable[[list[Slot], str, float], list[Slot]]


def misfire_choice(
    job: SchedulerJob, missed: list[Slot], now: datetime.datetime, reached_now: bool, capped: bool = False
) -> list[Slot]:
    """The missed slots the job's misfire policy runs: none, the latest, or all, within its catchup_window.

    ``reached_now``: the pass judged every slot up to now.  One that stopped short says where,
    and the next pass goes on from there.  Stopped at its cap of MAX_SLOTS (``capped``: a long
    outage), it leaves the choice to the pass that reaches now, since the newest missed slots
    lie past where it stopped: ``run_all`` runs at most the job's max_catchup_runs, the newest,
    and the slots before them, those of the passes that stopped short included, are reported
    missed, so a long outage's catch-up is bounded however many passes it takes to judge.
    Stopped before a run still holding its lease, the slots it judged are older than that run:
    ``run_latest`` has nothing to run (a newer slot is running), ``run_all`` and ``compact`` run
    them, as no later pass judges them again."""
    if job.misfire == "none" or capped or (not reached_now and job.misfire == "run_latest"):
        return []
    reachable = [s for s in missed if s.schedule_time >= now - datetime.timedelta(seconds=job.catchup_window)]
    if job.misfire == "run_latest":
        return reachable[-1:]
    if job.misfire == "compact":
        return reachable  # one run: the compaction bounds what it covers
    return reachable[-job.max_catchup_runs :]


def audit(
    ledger: Ledger,
    jobs: tuple[BoundJob, ...],
    catch_up: CatchUp | None = None,
    pause: Pause | None = None,
    compact: Compact | None = None,
    after_exclusion: AfterExclusion | None = None,
) -> AuditPass:
    """One pass over every Scheduler job: the slots it reports (each logged once at ERROR), and
    how many it could not check.  With ``catch_up``, the missed slots a job's misfire policy
    names are run instead of reported (one WARNING line each, ``outcome: caught_up``); with
    ``compact``, those of ``misfire: compact`` are covered by one run of the newest; with
    ``after_exclusion``, the pass that judges an exclusion window's last slot runs the window's
    slots as catch_up_after_exclusion says, once the window ends.  Each breach
    of a job's finish_within, max_runtime and failure streaks is logged once at ERROR (``late``,
    ``overdue``, ``slow``, ``failing``); with ``pause``, a job failing pause_after_consecutive_failures
    times in a row is paused."""
    now = ledger.clock.now()
    # The reads, batched: every job's mark in one lookup, every slot's record in another (the
    # store splits batches over Datastore's limit).
    keys = [ndb.Key(AuditMark, history_id(job.declared)) for job in jobs]
    # With the marks, each job's day summaries of the last day or so: a slot whose finished run
    # noted itself there is judged from its note (the facts its record holds), its record unread.
    days = days_between(now - DAY, now)  # two, whatever the hour
    summaries = summaries_of(ledger.store(), [key.id() for key in keys], days)
    marks = [summary.mark for summary in summaries]  # None where a job has none yet
    plans = [_slots_to_judge(job, mark, now) for job, mark in zip(jobs, marks, strict=True)]
    noted = {
        slot.run_id: note
        for (slots, _), summary in zip(plans, summaries, strict=True)
        for slot in slots
        # Past its horizon a slot is judged as its record says (gone: ``unknown``), as every view does.
        if slot.is_remembered(now) and (note := summary.noted(slot.schedule_time)) is not None
    }
    records = ledger.lookup_many([slot.run_id for slots, _ in plans for slot in slots if slot.run_id not in noted])
    facts: dict[str, RunRecord | RunDigest] = {**records, **noted}
    judged = [
        _judge(job, now, keys[index], marks[index], *plans[index], facts, summaries[index])
        for index, job in enumerate(jobs)
    ]
    # What follows a mark that landed (lines, catch-up, pauses, the deadline rules) may call out:
    # on a few threads with contexts of their own, so a fleet's pass is bound by round trips, not CPU.
    client = ndb.get_context().client
    results = [AuditPass() for _ in jobs]

    def report(index: int, context: bool = True) -> None:
        if not context:  # on the caller's thread, in its context
            _report(ledger, judged[index], now, results[index], catch_up, pause, compact, after_exclusion)
            return
        with client.context():
            _report(ledger, judged[index], now, results[index], catch_up, pause, compact, after_exclusion)

    # Each batch's marks, then at once its reports: a batch that fails after an earlier one landed
    # (an outage, a lost answer past its patience) ends the pass with every landed mark reported,
    # since the next pass starts after them and would never report their slots.
    ours = []
    for first in range(0, len(judged), COMMIT_BATCH):
        batch = range(first, min(first + COMMIT_BATCH, len(judged)))
        landed = move_marks(ledger.store(), [judged[index].move for index in batch])
        moved = [index for index in batch if judged[index].key in landed]
        ours += moved
        if len(moved) <= 1:
            for index in moved:
                report(index, context=False)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(AUDIT_THREADS, len(moved))) as pool:
                for done in [pool.submit(report, index) for index in moved]:
                    done.result()
    found = AuditPass()
    for result in results:  # in the jobs' order, whichever finished first
        found.reported += result.reported
        found.caught_up += result.caught_up
        found.breaches += result.breaches
        found.unverified += result.unverified
    found.attention = {judged[index].key.id(): judged[index].attention_until for index in ours}
    found.contended = len(ours) < len(judged)
    return found


AUDIT_THREADS = 8


def _slots_to_judge(
    job: BoundJob, mark: AuditMark | None, now: datetime.datetime
) -> tuple[list[Slot], datetime.datetime]:
    """The slots whose retry window closed since the mark, and how far this pass may move it."""
    window = Slot(job.declared, now).window_closes - now
    # A first pass judges the slots from when the job's are expected (their windows close a window later).
    checked_until = mark.checked_until if mark else (job.expected_from + window if job.expected_from else now)
    # The slots whose window closed in [checked_until, now): scheduled a window earlier.
    slots = slots_between([job], checked_until - window, now - window, MAX_SLOTS)
    through = now if len(slots) < MAX_SLOTS else slots[-1].schedule_time + window + MICROSECOND
    return slots, through


# A mark to move: its key, the mark as the pass read it (None: none yet), where it moves to, and
# the other fields it then holds.
Move = tuple[ndb.Key, AuditMark | None, datetime.datetime, dict[str, Any]]


def move_marks(store: Store, moves: list[Move]) -> set[ndb.Key]:
    """Move each mark to its place, in a transaction per COMMIT_BATCH marks, where each lands only
    if no other pass moved it since it was read; the keys of the moves that landed (their
    answers lost or not)."""
    # Unique to this pass: another pass that computed the same mark must not take its commit for ours.
    pass_id = uuid.uuid4().hex

    def advance(batch: list[Move]) -> Callable[[Transaction], set[ndb.Key]]:
        def body(transaction: Transaction) -> set[ndb.Key]:
            ours = set()
            for (key, read, through, fields), found in zip(batch, transaction.get([m[0] for m in batch]), strict=True):
                current = found.record if found else None
                if current is not None and pass_id in (current.pass_id, current.previous_pass_id):
                    ours.add(key)  # this pass's own commit (perhaps moved on from), its answer lost
                    continue
                if _seen(current) != _seen(read):
                    continue  # another pass got here first: it reports these slots
                previous = current.pass_id if current else None
                transaction.put(
                    AuditMark(key=key, checked_until=through, pass_id=pass_id, previous_pass_id=previous, **fields)
                )
                ours.add(key)
            return ours

        return body

    landed: set[ndb.Key] = set()
    for first in range(0, len(moves), COMMIT_BATCH):
        moved, _ = transact(advance(moves[first : first + COMMIT_BATCH]), AUDIT_PATIENCE_SECONDS, store)
        landed |= moved
    return landed


def _seen(mark: AuditMark | None) -> tuple[datetime.datetime, str | None] | None:
    """What tells one state of a mark from the next: where it stands, and the pass that put it there."""
    return (mark.checked_until, mark.pass_id) if mark else None


@dataclasses.dataclass(frozen=True)
class _Judged:
    """One Scheduler job's slots, judged by a pass before its mark moves."""

    job: BoundJob
    key: ndb.Key
    mark: AuditMark | None
    through: datetime.datetime
    reported: list[ReportedSlot]
    unknown: list[Slot]
    settled: list[tuple[Slot, ExecutionStatus]]  # decided without a run: counted (schedules.metrics), not reported
    streak: int
    reached: list[int]  # each streak length this pass reached, in order: a streak can rise and end in one pass
    repairs: dict[str, Any]
    attention_until: datetime.datetime | None
    slots_attention_until: datetime.datetime | None
    # The exclusion windows whose last slot this pass judged: (that slot, the window's start, its end).
    windows_judged: list[tuple[Slot, datetime.datetime, datetime.datetime]] = dataclasses.field(default_factory=list)
    capped: bool = False  # the pass stopped at MAX_SLOTS of the job, short of now
    progress_at: datetime.datetime | None = None  # the newest judged slot that made progress, so far

    @property
    def move(self) -> Move:
        """Its mark's move: to where the pass judged, with the failure streak it reached and the
        summaries' repairs (in the same commit: a row never trusts a pass whose mark did not land)."""
        fields = {
            "failure_streak": self.streak,
            "slots_attention_until": self.slots_attention_until,
            "repairs": self.repairs,
            "attention_until": self.attention_until,
            "progress_at": self.progress_at,
        }
        return self.key, self.mark, self.through, fields


def _judge(
    bound: BoundJob,
    now: datetime.datetime,
    key: ndb.Key,
    mark: AuditMark | None,
    slots: list[Slot],
    through: datetime.datetime,
    records: Mapping[str, RunRecord | RunDigest],
    summaries: JobSummaries,
) -> _Judged:
    job = bound.declared
    capped = through < now  # _slots_to_judge stops short of now only at MAX_SLOTS
    window = Slot(job, now).window_closes - now
    statuses = [execution_status(s, records.get(s.run_id), now) for s in slots]
    # A run still holding a live lease past its window (a long lease, a heartbeat) may yet be
    # missed: stop the mark before it, and report only what lies before it.
    pending = [s for s, status in zip(slots, statuses, strict=True) if status == ExecutionStatus.IN_PROGRESS]
    if pending:
        through = min(through, pending[0].schedule_time + window)
    checked = [(s, status) for s, status in zip(slots, statuses, strict=True) if s.schedule_time + window < through]
    reported = [ReportedSlot(s, status) for s, status in checked if status in REPORTED]
    unknown = [s for s, status in checked if status == ExecutionStatus.UNKNOWN]
    settled = [(s, status) for s, status in checked if _settled(s, status, records.get(s.run_id))]
    streak = mark.failure_streak if mark else 0
    reached = []
    for _, status in checked:
        if status == ExecutionStatus.FAILED:
            streak += 1
            reached.append(streak)
        elif status == ExecutionStatus.COMPLETED:
            streak = 0
    if job.pause_after_consecutive_failures in reached:
        streak = 0  # the audit pauses the job: after a resume, its failures count afresh
    kept = mark.repairs if mark else None
    repairs = repairs_for(((s.schedule_time, records.get(s.run_id)) for s, _ in checked), summaries, kept, now)
    needing = [s.schedule_time for s, _ in checked if shown_status(s, records.get(s.run_id), now) in NEEDS_ATTENTION]
    of_slots = max(
        filter(None, [mark.slots_attention_until if mark else None, needing[-1] + DAY if needing else None]),
        default=None,
    )
    attention = max(filter(None, [of_slots, FOREVER if streak else None]), default=None)
    windows = _windows_judged(bound, checked) if job.catch_up_after_exclusion != "none" else []
    progressed = [s.schedule_time for s, status in checked if status in PROGRESS_STATUSES]
    # A new mark counts from when the job's slots are expected; one kept from before progress was
    # noted counts from now: never a page for a deploy.
    kept_progress = (mark.progress_at or now) if mark else bound.expected_from
    progress_at = progressed[-1] if progressed else kept_progress
    return _Judged(
        bound,
        key,
        mark,
        through,
        reported,
        unknown,
        settled,
        streak,
        reached,
        repairs,
        attention,
        of_slots,
        windows,
        capped,
        progress_at,
    )


def _windows_judged(
    bound: BoundJob, checked: list[tuple[Slot, ExecutionStatus]]
) -> list[tuple[Slot, datetime.datetime, datetime.datetime]]:
    """The exclusion windows whose last slot is among ``checked``: an excluded slot whose next slot
    lies past its window's end.  So each window is found once, by the pass whose mark lands past it."""
    ended = []
    for slot, status in checked:
        window = slot.exclusion if status == ExecutionStatus.EXCLUDED else None
        occurrence = window.occurrence(slot.schedule_time, schedule_zone(slot.job.time_zone)) if window else None
        if occurrence is not None and nearest_slots(bound, slot.schedule_time)[1] >= occurrence[1]:
            ended.append((slot, *occurrence))
    return ended


def _settled(slot: Slot, status: ExecutionStatus, record: object) -> bool:
    """Whether the pass decides this slot although it reports nothing of it: paused by a pause
    that has ended (one still lasting leaves it to the resume's catch-up, which counts what it
    leaves: service.outcomes), or excluded with no run (an excluded delivery's skip is counted
    at the delivery)."""
    if status == ExecutionStatus.PAUSED:
        pause = slot.pause  # its window closed after the pause ended: the resume leaves it here
        return pause is not None and pause.until is not None and slot.window_closes >= pause.until
    return status == ExecutionStatus.EXCLUDED and record is None


# A failure streak's attention: until a pass ends the streak, however long the audit is away.
FOREVER = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)


def _report(
    ledger: Ledger,
    judged: _Judged,
    now: datetime.datetime,
    found: AuditPass,
    catch_up: CatchUp | None,
    pause: Pause | None,
    compact: Compact | None = None,
    after_exclusion: AfterExclusion | None = None,
) -> None:
    """What a job's judged slots call for, once its mark has landed: so only the pass that
    reports a slot runs it, once each."""
    bound, through, reported, unknown = judged.job, judged.through, judged.reported, judged.unknown
    job = bound.declared
    missed = [f.slot for f in reported if f.status == ExecutionStatus.MISSED]
    chosen = misfire_choice(job, missed, now, reached_now=through >= now, capped=judged.capped)
    if job.misfire == "compact":
        caught_up = compact(chosen) if compact is not None and chosen else []
    else:
        caught_up = [slot for slot in chosen if catch_up is not None and catch_up(slot)]
    if job.misfire == "compact" and caught_up:  # one line for the run and all it stands for
        log.warning(
            "%d executions of %s from %s to %s were missed and are run now as one, as its misfire policy (compact) "
            "says: the run of %s stands for the others",
            len(caught_up),
            job.name,
            format_utc(caught_up[0].schedule_time),
            format_utc(caught_up[-1].schedule_time),
            format_utc(caught_up[-1].schedule_time),
            extra={**ReportedSlot(caught_up[-1]).document(), "outcome": "caught_up", "slots": len(caught_up)},
        )
    for slot in caught_up if job.misfire != "compact" else ():
        log.warning(
            "execution of %s at %s was missed and is run now, as its misfire policy (%s) says",
            slot.job.name,
            format_utc(slot.schedule_time),
            job.misfire,
            extra={**ReportedSlot(slot).document(), "outcome": "caught_up"},
        )
    taken = {slot.run_id for slot in caught_up}
    reported = [finding for finding in reported if finding.slot.run_id not in taken]
    for finding in reported:
        slot = finding.slot
        if finding.status == ExecutionStatus.MISSED:
            message = "execution of %s at %s was missed: no run completed, failed or was skipped, and no retry can come"
        elif finding.status == ExecutionStatus.STUCK:
            message = (
                "execution of %s at %s is stuck: an attempt started and never finished, its lease ran out and no "
                "retry can come; it may have taken effect, so it is not run again unless an operator acknowledges that"
            )
        else:
            message = (
                "execution of %s at %s never ran: its key holds a run of another job (a misrouted delivery); "
                "scope the deliveries or rename one Scheduler job, then run the slot"
            )
        log.error(
            message,
            slot.job.name,
            format_utc(slot.schedule_time),
            # Log outcomes are the request lines' words: another job's run under the key is job_mismatch.
            extra={**finding.document(), "outcome": LOG_OUTCOMES[finding.status]},
        )
    if unknown:
        log.warning(
            "%d execution(s) of %s from %s to %s could not be checked: the audit came after the job's retention "
            "(%gs), so a run of them may have completed and been forgotten; they are listed as unknown",
            len(unknown),
            job.name,
            format_utc(unknown[0].schedule_time),
            format_utc(unknown[-1].schedule_time),
            bound.retention_seconds,
            extra={"scheduler_job": job.name, "outcome": "unverified", "slots": len(unknown)},
        )
    for finding in reported:
        outcome = outcome_of(finding.status, None)
        if outcome is not None:
            count(finding.slot.job.name, job.target, outcome, Source.AUDIT)
    for slot, status in judged.settled:
        outcome = outcome_of(status, None)
        if outcome is not None:
            count(slot.job.name, job.target, outcome, Source.AUDIT)
    found.reported += reported
    found.caught_up += caught_up
    if after_exclusion is not None:
        found.caught_up += _after_windows(ledger, judged, now, after_exclusion)
    _pauses_nobody_counted(ledger, bound, now)
    # Since the newest slot that made progress (or, before any, since the job's slots are expected).
    since = judged.progress_at or bound.expected_from
    if since is not None:
        note_progress_age(job.name, job.target, (now - since).total_seconds())
    found.unverified += len(unknown)
    _failure_streak(job, judged.reached, found, pause)
    _deadline_passes(ledger, bound, now, found)


# How long an ended pause waits for its resume's catch-up before the audit counts what it left.
RESUME_GRACE = datetime.timedelta(hours=1)


def _pauses_nobody_counted(ledger: Ledger, bound: BoundJob, now: datetime.datetime) -> None:
    """The ended pauses whose left slots no resume counted (ended by scheduler.yaml, or a resume
    whose catch-up never went out) an hour after they ended: counted ``paused`` now, once."""
    for interval in bound.pauses:
        if interval.until is None or interval.counted or now - interval.until < RESUME_GRACE:
            continue
        try:
            marked = mark_counted(bound.declared, interval.since, ledger.store())
        except Exception:
            log.warning("%s's ended pause was not counted: the next pass tries", bound.declared.name, exc_info=True)
            continue
        if marked:
            count_left_paused(ledger, bound, interval, set(), Source.AUDIT)


def _after_windows(ledger: Ledger, judged: _Judged, now: datetime.datetime, run: AfterExclusion) -> list[Slot]:
    """Each window whose last slot this pass judged: its excluded slots (within the job's
    catchup_window) run as catch_up_after_exclusion says, once the window ends; one WARNING line
    each window.  The slots run (``excluded`` before) are decided again by their run."""
    job, taken = judged.job.declared, []
    reach = now - datetime.timedelta(seconds=job.catchup_window)
    for last, begins, ends in judged.windows_judged:
        excluded: list[Slot] = []
        for slots in slot_pages([judged.job], max(begins, reach), last.schedule_time + MICROSECOND):  # however many
            records = ledger.lookup_many([slot.run_id for slot in slots])
            excluded += [
                s for s in slots if execution_status(s, records.get(s.run_id), now) == ExecutionStatus.EXCLUDED
            ]
        if not excluded:
            continue
        ran = run(excluded, job.catch_up_after_exclusion, max(0.0, (ends - now).total_seconds()))
        if ran:
            log.warning(
                "the exclusion window of %s from %s until %s ends: %s (catch_up_after_exclusion: %s)",
                job.name,
                format_utc(begins),
                format_utc(ends),
                f"its newest slot, {format_utc(ran[-1].schedule_time)}, runs then"
                if len(ran) == 1
                else f"one run of {format_utc(ran[-1].schedule_time)} stands for its {len(ran) - 1} other slots",
                job.catch_up_after_exclusion,
                extra={"scheduler_job": job.name, "outcome": "caught_up", "slots": len(ran)},
            )
        taken += ran
    return taken


def _failure_streak(job: SchedulerJob, reached: list[int], found: AuditPass, pause: Pause | None) -> None:
    """One ERROR line when the streak reaches alert_after_consecutive_failures, and a pause at
    pause_after_consecutive_failures (Temporal's pause on failure, Airflow's max failed runs)."""
    alert_at = job.alert_after_consecutive_failures
    if alert_at is not None and alert_at in reached:
        base = {"job_id": job.target, "scheduler_job": job.name, "failures_in_a_row": alert_at}
        log.error("%s has failed %d times in a row", job.name, alert_at, extra={**base, "outcome": "failing"})
        found.breaches.append({**base, "outcome": "failing"})
    pause_at = job.pause_after_consecutive_failures
    if pause_at is not None and pause_at in reached:
        base = {"job_id": job.target, "scheduler_job": job.name, "failures_in_a_row": pause_at}
        note = f"paused by the audit: {pause_at} failed executions in a row (pause_after_consecutive_failures)"
        paused = pause is not None and pause(job, note)
        log.error(
            "%s has failed %d times in a row: %s",
            job.name,
            pause_at,
            "paused" if paused else "it could not be paused",
            extra={**base, "outcome": "failing", "paused": paused},
        )
        found.breaches.append({**base, "outcome": "failing", "paused": paused})


# The deadline rules: the AuditMark each keeps (beside the missed-execution mark), the job's
# setting, and the breach each judges a slot by once its time has passed.
DEADLINE_RULES = ("finish_within", "max_runtime")


def _deadline_passes(ledger: Ledger, job: BoundJob, now: datetime.datetime, found: AuditPass) -> None:
    for rule in DEADLINE_RULES:
        seconds = getattr(job.declared, rule)
        if seconds is not None:
            _deadline_pass(ledger, job, now, found, rule, datetime.timedelta(seconds=seconds))


def _deadline_pass(
    ledger: Ledger,
    job: BoundJob,
    now: datetime.datetime,
    found: AuditPass,
    rule: str,
    offset: datetime.timedelta,
) -> None:
    """Judge once each slot whose ``rule`` deadline (its time plus ``offset``) passed since the last pass."""
    key = ndb.Key(AuditMark, f"{history_id(job.declared)}#{rule}")
    store = ledger.store()
    (mark,) = get_many(store, [key])
    # A first pass looks back two audit intervals at most: a rule added to a job that ran for
    # months pages for no old slot, and one added with the deploy misses no breach since.
    lookback = now - datetime.timedelta(seconds=2 * AUDIT_INTERVAL_SECONDS)
    checked_until = mark.checked_until if mark else max(lookback, job.expected_from or lookback)
    slots = slots_between([job], checked_until - offset, now - offset, MAX_SLOTS)
    through = now if len(slots) < MAX_SLOTS else slots[-1].schedule_time + offset + MICROSECOND
    records = ledger.lookup_many([slot.run_id for slot in slots])
    judged = [(s, _breach(rule, s, records.get(s.run_id), now, offset)) for s in slots]
    breaches = [(s, breach) for s, breach in judged if breach is not None and s.schedule_time + offset < through]
    if key not in move_marks(store, [(key, mark, through, {})]):
        return
    for slot, breach in breaches:
        document = {**ReportedSlot(slot).document(), "status": breach, "outcome": breach, "rule": rule}
        log.error(
            "execution of %s at %s is %s: %s",
            slot.job.name,
            format_utc(slot.schedule_time),
            breach,
            _BREACH_WORDS[breach].format(seconds=offset.total_seconds()),
            extra=document,
        )
        found.breaches.append(document)
        if breach == ExecutionStatus.LATE:
            count(slot.job.name, job.declared.target, Outcome.LATE, Source.AUDIT)  # beside the slot's ran outcome


_BREACH_WORDS = {
    "late": "it completed more than {seconds:g}s after its schedule time (finish_within)",
    "overdue": "it had not completed {seconds:g}s after its schedule time (finish_within)",
    "slow": "its run took longer than {seconds:g}s (max_runtime)",
}
# Statuses that say more than a deadline would: never judged by one.
_NOT_JUDGED = (
    ExecutionStatus.MISSED,  # reported as missed: not overdue as well
    ExecutionStatus.STUCK,  # reported as stuck, once: not overdue or slow as well
    ExecutionStatus.PAUSED,
    ExecutionStatus.EXCLUDED,
    ExecutionStatus.COVERED,
    ExecutionStatus.UNTRACKED,
    ExecutionStatus.UNKNOWN,
    ExecutionStatus.CONFLICT,
    ExecutionStatus.SKIPPED,
)


def _breach(rule: str, slot: Slot, record: Any, now: datetime.datetime, offset: datetime.timedelta) -> str | None:
    status = execution_status(slot, record, now)
    if status in _NOT_JUDGED or slot.pause is not None:
        return None
    if rule == "finish_within":
        if record is None or record.status != ExecutionStatus.COMPLETED:
            return "overdue" if status not in (ExecutionStatus.FAILED,) else None  # a failure alerts as one
        finished = record.finished or now
        return "late" if finished > slot.schedule_time + offset else None
    # max_runtime: a run that took, or has been taking, longer than allowed.
    if record is None or record.started is None:
        return None
    ended = record.finished if record.status != ExecutionStatus.IN_PROGRESS and record.finished else now
    return "slow" if ended - record.started > offset else None
