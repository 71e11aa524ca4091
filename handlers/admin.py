"""``/admin/``: the operator dashboard, server-rendered (no front-end build step).

What ran, what is running (and how long its lease has left), what is stuck
(lease over, not finished) and what failed, per job, with a timeline that
reads at a glance.  Every value goes through Jinja's autoescaping:
downstream error bodies are untrusted data.
"""

from __future__ import annotations

import datetime
import json
import statistics
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from flask import Blueprint, Response, abort, jsonify, make_response, redirect, render_template, request, url_for
from markupsafe import Markup, escape
from werkzeug.wrappers import Response as WerkzeugResponse

from dedup.keys import format_utc, is_run_id, parse_rfc3339
from dedup.queries import RunFilter
from handlers.access import Role, requires
from handlers.client_tokens import client_token_problem, new_form_token
from handlers.history_range import DAYS, HISTORY_PAGE, HistoryRange, bulk_slots, history_range
from handlers.job_rows import SEARCH_MAX, PageOutOfRange, row_page
from handlers.links import link
from handlers.run_documents import deliveries_of, duration_seconds, may_retry, run_document, scheduler_job_document
from handlers.slot_statuses import LEGEND, MARK_SHAPES
from handlers.state import app_state, may
from models import RunRecord, RunSource, RunStatus
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, history_id, schedule_zone
from schedules.slots import (
    RUNNABLE,
    ExecutionStatus,
    Slot,
    declared_job,
    execution_document,
    latest_slots,
    ran_once_or_more,
    run_status,
    slot_of_run,
)
from schedules.tallies import DELIVERIES_LISTED, deliveries_of_slot
from service.hours import hour_counts
from service.runs import runs_of_token
from service.slots import executions_between

blueprint = Blueprint("admin", __name__, url_prefix="/admin", template_folder="templates")
# ``/``: where a browser pointed at the app's address lands.
home = Blueprint("home", __name__)

RECENT_RUNS = 100
# The run page shows at most this much of each stored document, as escaped HTML
# (pretty-printed and escaped it can grow several times over); the run API has it all.
MAX_SHOWN_DOCUMENT_BYTES = 128 * 1024
RUNS_PER_JOB = 50
CHART_WIDTH, CHART_LEFT, CHART_ROW = 960, 170, 30
CARD_SLOTS = 48  # the expected executions a job card looks at (the newest of the last day)
CARD_SCHEDULES = 10  # the Scheduler jobs a card names with their Pause forms (the table lists all)
CARD_RUNNING = 10  # the runs in progress a card names (it counts them all; every stuck one is named)


# The statuses a run can be shown with, and those only a slot without a run has.
SLOT_ONLY_STATUSES = frozenset(
    {ExecutionStatus.DUE, ExecutionStatus.UPCOMING, ExecutionStatus.UNKNOWN, ExecutionStatus.UNTRACKED}
)
SHOWN_STATUSES = tuple(dict.fromkeys([*(s.value for s in RunStatus), *(str(s) for s in ExecutionStatus)]))


@blueprint.get("/", provide_automatic_options=False)
@requires(Role.VIEW)
def dashboard():
    state = app_state()
    now = state.clock.now()
    chosen = {name: request.args.get(name) or None for name in ("job", "status", "source")}
    if chosen["status"] not in (None, *SHOWN_STATUSES) or chosen["source"] not in (
        None,
        *[s.value for s in RunSource],
    ):
        abort(400, "unknown status or source")
    # A status the legend shows is filtered by as every view shows it (run_status): a stored one is
    # asked of the query too; a derived one (stuck, late, overdue) is found among the newest runs.
    stored = chosen["status"] if chosen["status"] in set(RunStatus) else None
    try:
        run_filter = RunFilter(job_id=chosen["job"], status=stored, source=chosen["source"])
    except ValueError as exc:
        abort(400, str(exc).replace("job_id", "job"))
    if chosen["job"] and chosen["job"] not in state.jobs:
        abort(404, f"jobs.yaml has no job {chosen['job']!r}: {', '.join(sorted(state.jobs))}")
    search, page_text = request.args.get("q") or "", request.args.get("page") or "1"
    if len(search) > SEARCH_MAX:
        abort(400, f"a search (q) is at most {SEARCH_MAX} characters")
    if not (page_text.isascii() and page_text.isdigit() and len(page_text) <= 6):
        abort(400, "page must be a whole number, 1 or more")
    recent, _ = state.ledger.find_runs(run_filter, RECENT_RUNS)
    carded = [job_id for job_id in sorted(state.jobs) if not chosen["job"] or job_id == chosen["job"]]
    # Each card's newest runs and every run still in progress, however old (a stuck one must not
    # hide behind newer runs): the queries of every card sent at once, one round trip for all.
    pages = state.ledger.find_runs_together(
        [
            run_filter
            for job_id in carded
            for run_filter in (RunFilter(job_id=job_id), RunFilter(job_id=job_id, status=RunStatus.IN_PROGRESS))
        ],
        RUNS_PER_JOB,
    )
    # The pauses of the Scheduler jobs this page shows (its runs', its cards' slots' and schedules'),
    # in one lookup: not every job of the fleet (schedules.attention orders the rows without them).
    schedules_of_job = _schedules_by_target(state.bound_schedules)
    card_slots = {job_id: _card_slots(schedules_of_job.get(job_id, []), now) for job_id in carded}
    named = {job_id: schedules_of_job.get(job_id, [])[:CARD_SCHEDULES] for job_id in carded}
    shown_runs = [*recent, *(record for page in pages for record in page)]
    bound = state.with_pauses(_scheduler_jobs_of(state.bound_schedules, shown_runs, card_slots, named))
    by_id = {history_id(job.declared): job for job in bound}
    if chosen["status"]:
        recent = [record for record in recent if run_status(record, bound, now) == chosen["status"]]
    rebound = {
        job_id: [Slot(s.job, s.schedule_time, by_id[history_id(s.job)]) for s in of_job]
        for job_id, of_job in card_slots.items()
    }
    expected = expected_executions(rebound, now)
    summaries = [
        job_summary(
            job_id,
            pages[2 * index],
            pages[2 * index + 1],
            now,
            expected[job_id],
            [scheduler_job_document(by_id[history_id(job.declared)]) for job in named[job_id]],
            bound,
            len(schedules_of_job.get(job_id, [])),
        )
        for index, job_id in enumerate(carded)
    ]
    try:
        row_page_shown = row_page(state, now, int(page_text), search, chosen["job"])
    except PageOutOfRange as exc:
        abort(400, str(exc))
    gaps = [
        (job_id, e)
        for job_id, executions in expected.items()
        for e in executions
        if e["status"] == ExecutionStatus.MISSED
    ]
    return render_template(
        "admin/dashboard.html",
        now=format_utc(now),
        summaries=summaries,
        job_rows=row_page_shown.rows,
        row_page=row_page_shown,
        search=search,
        chosen=chosen,
        sources=[source.value for source in RunSource],
        runs=[row(record, now, bound) for record in recent],
        chart=timeline(recent, now, gaps, bound),
        job_ids=sorted(state.jobs),
        # External jobs' handlers run them elsewhere: no Run now on their cards, and why.
        external={job_id: job.runner.external.url for job_id, job in state.jobs.items() if job.runner.external},
        statuses=list(SHOWN_STATUSES),
        # A slot with no run (due, upcoming, ...) is in no runs table: its history lists it.
        status_without_runs=chosen["status"] in SLOT_ONLY_STATUSES,
        can_operate=may(Role.OPERATE),
        new_form_token=new_form_token,
        shapes=MARK_SHAPES,
        legend=LEGEND,
    )


@home.get("/", provide_automatic_options=False)
@requires(Role.VIEW)
def index() -> Response:
    """A 302 to the dashboard, for whoever may see it; its JSON body names the run API for scripts.

    Behind the same gate as the dashboard: a caller who may not view (Cloud Scheduler aimed at
    ``/`` instead of ``/jobs/<job_id>``) gets the 401 or 403 that names what it lacks.
    """
    response = jsonify({"dashboard": "/admin/", "runs": "/api/v1/runs"})
    response.status_code = 302
    response.headers["Location"] = "/admin/"
    return response


@blueprint.get("/runs/<run_id>", provide_automatic_options=False)
@requires(Role.VIEW)
def run_page(run_id: str):
    state = app_state()
    record = state.ledger.lookup(run_id) if is_run_id(run_id) else None
    queued = queued_attempt(request.args.get("queued"))
    if record is None and queued is not None and is_run_id(run_id):
        # An action queued it a moment ago (dashboard_actions.to_queued): it has no record until the task runs.
        # Its refreshes count themselves (``polls``), and stop after QUEUED_POLLS: a task that never
        # runs (a paused queue, a link nobody's action made) must not keep a page polling forever.
        polls = queued_attempt(request.args.get("polls")) or 0
        # Only what this page reads travels, checked: never the rest of the query (handlers.links).
        asked = {"queued": queued, "sent": sent_fingerprint(request.args.get("sent")), "polls": polls + 1}
        again = link("admin.run_page", {"run_id": run_id}, asked)
        return render_template(
            "admin/queued.html",
            run_id=run_id,
            refresh=REFRESH_SECONDS if polls < QUEUED_POLLS else None,
            refresh_url=again,
            waited=polls * REFRESH_SECONDS,
        )
    if record is None:
        abort(404, f"no run {run_id} (or it has expired)")
    now = state.clock.now()
    waiting = queued is not None and record.attempt <= queued  # the queued attempt has not started yet
    document = run_document(record, now)
    bound = state.with_pauses()
    slot = slot_of_run(record, bound)
    status = run_status(record, bound, now)
    zone = schedule_zone(slot.job.time_zone) if slot else None
    # The deliveries its slot absorbed (schedules.tallies, kept 48 hours): a scheduled run's only.
    duplicates = deliveries_of_slot(history_id(slot.job), slot.schedule_time, now) if slot else None
    return render_template(
        "admin/run.html",
        run=document,
        outcome=status,
        now=format_utc(now),
        zone=slot.job.time_zone if slot else None,
        zone_info=zone,
        # The history page's day is the job's own: 00:30 in Berlin is the day before in UTC.
        history_day=slot.schedule_time.astimezone(zone).date().isoformat() if slot and zone else None,
        duplicates=duplicates,
        deliveries=deliveries_of(document, duplicates),
        listed_max=DELIVERIES_LISTED,
        tally_kept=slot is not None,
        lateness=_lateness(record),
        lease_left=lease_left(record, now),
        # Result and error apart: a completed run's result; a failed or released run's error;
        # a kept HTTP response (manual runs, guarded calls) as its own.
        result=shown_json(document["result"], run_id) if "result" in document else None,
        error=shown_json(document["error"], run_id) if "error" in document else None,
        response=shown_json(document["response"], run_id) if "response" in document else None,
        reason=document.get("reason"),
        pause=slot.pause.document() if slot and slot.pause else None,
        parameters=shown_json(record.parameters, run_id) if record.parameters else None,
        may_retry=may(Role.OPERATE) and may_retry(record, state.jobs),
        # A scheduled run that failed or was skipped may be run again under its slot's key.
        run_again=slot if slot and may(Role.OPERATE) and status in RUNNABLE else None,
        stuck=_stuck_facts(record, slot, now) if status == ExecutionStatus.STUCK else None,
        logs_url=logs_query_url(run_id, record.project or state.project),
        # The run took another send's parameters (a form resent with others before its task ran).
        sent_other=sent_fingerprint(request.args.get("sent")) not in (None, record.fingerprint),
        answer=ACTION_ANSWERS["queued"]
        if waiting
        else ACTION_ANSWERS["started"]
        if queued is not None
        else ACTION_ANSWERS.get(request.args.get("answer", "")),
        # While a queued attempt has not started, the refresh keeps asking after it.
        refresh_url=request.full_path if waiting else request.path,
        # Refreshed while someone holds the run: a stuck one (its lease over) changes only when a
        # person or a delivery acts, so a refresh would poll forever.
        refresh=REFRESH_SECONDS
        if waiting or (record.status == RunStatus.IN_PROGRESS and record.lease_is_live(now))
        else None,
    )


def _stuck_facts(record: RunRecord, slot: Slot | None, now: datetime.datetime) -> dict[str, Any]:
    """What is known of a stuck run's last attempt: where and when it ran, when it last wrote its
    record (its claim or a lease renewal), whether it recorded a downstream resource, and whether a
    Scheduler retry can still take it over."""
    latest = (record.attempts or [{}])[-1]
    return {
        "attempt": record.attempt,
        "started": latest.get("started") or (format_utc(record.started) if record.started else None),
        "instance": latest.get("instance"),
        "last_written": format_utc(record.updated),
        "lease_expired": format_utc(record.lease_expires),
        "downstream": record.downstream,
        "retry_may_come": slot is not None and now < slot.window_closes,
    }


def _lateness(record: RunRecord) -> float | None:
    """How long after its schedule time the run first started: its first attempt kept, not the
    latest (a slot run again hours later was not that late)."""
    if record.schedule_time is None:
        return None
    starts = [parse_rfc3339(a["started"], "started") for a in record.attempts or [] if a.get("started")]
    first = min(starts, default=record.started)
    return (first - record.schedule_time).total_seconds() if first else None


# What the action that led here did (dashboard_actions.to_run_page), in words; any other value says nothing.
ACTION_ANSWERS = {
    "ran": "Done: this request ran it. Its outcome is below.",
    "released": "This request ran it and it failed in a way a retry may cure: it is released, and the next "
    "delivery or a retry runs it again.",
    "taken_over": "This request ran it, but its lease ran out before it finished and another attempt took it over.",
    "already": "Already ran: an earlier request ran it, so nothing ran again.",
    "running": "Already running: an earlier request is running it. This page refreshes until it ends.",
    "skipped": "Not run: the run is recorded as skipped, for the reason below.",
    "queued": "Queued: the task queue starts it in a moment. This page refreshes until it does.",
    "started": "Started: it was queued, and the task queue delivered it.",
}


def queued_attempt(text: str | None) -> int | None:
    """``?queued=``: the attempt the run had when an action queued it (0: none); else None."""
    if text is None or not (text.isascii() and text.isdigit() and len(text) <= 7):
        return None
    return int(text)


def sent_fingerprint(text: str | None) -> str | None:
    """``?sent=``: the fingerprint of the parameters an action sent (64 hex digits); else None."""
    return text if text is not None and is_run_id(text) else None  # the same shape as a run id


# How often a run page refreshes itself while its run is held, and how often a queued one does
# before it says the run has not started (5 minutes).
REFRESH_SECONDS = 5
QUEUED_POLLS = 60


def logs_query_url(run_id: str, project: str | None) -> str:
    """Cloud Logging's Logs Explorer, querying this run's lines (every line of a run carries run_id)."""
    query = urllib.parse.quote(f'jsonPayload.run_id="{run_id}"', safe="")
    return f"https://console.cloud.google.com/logs/query;query={query}" + (
        f"?project={urllib.parse.quote(project, safe='')}" if project else ""
    )


def shown_json(value: Any, run_id: str) -> Markup:
    """``value`` pretty-printed and HTML-escaped, cut at MAX_SHOWN_DOCUMENT_BYTES with a pointer to the whole.

    Cut after escaping: a ``&`` stored as one byte is five in the page.
    """
    escaped = escape(json.dumps(value, indent=2, ensure_ascii=False, default=str))
    if len(str(escaped).encode("utf-8")) <= MAX_SHOWN_DOCUMENT_BYTES:
        return escaped
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    low, high = 0, len(text)  # the longest prefix whose escaped form fits
    while low < high:
        middle = (low + high + 1) // 2
        if len(str(escape(text[:middle])).encode("utf-8")) <= MAX_SHOWN_DOCUMENT_BYTES:
            low = middle
        else:
            high = middle - 1
    return escape(text[:low]) + escape(
        f"\n… {len(text) - low} more characters; the whole record: GET /api/v1/runs/{run_id}"
    )


def lease_left(record: RunRecord, now: datetime.datetime) -> int | None:
    if record.status != RunStatus.IN_PROGRESS or record.lease_expires <= now:
        return None
    return int((record.lease_expires - now).total_seconds())


def row(record: RunRecord, now: datetime.datetime, jobs: Sequence[BoundJob]) -> dict[str, Any]:
    """A run as the table and a card list it, with its one status (schedules.slots.run_status)."""
    return {
        "run_id": record.run_id,
        "job_id": record.job_id,
        "source": record.source,
        "outcome": run_status(record, jobs, now),
        "attempt": record.attempt,
        "when": format_utc(record.schedule_time or record.created),
        "duration": duration_seconds(record),
        "lease_left": lease_left(record, now),
    }


def expected_executions(slots: Mapping[str, Sequence[Slot]], now: datetime.datetime) -> dict[str, list[dict[str, Any]]]:
    """Each job's card slots (``_card_slots``, bound to their pauses) with their status: every
    job's in one batched lookup."""
    records = app_state().ledger.lookup_many([slot.run_id for of_job in slots.values() for slot in of_job])
    return {
        job_id: [execution_document(slot, records.get(slot.run_id), now) for slot in of_job]
        for job_id, of_job in slots.items()
    }


def _schedules_by_target(jobs: Sequence[BoundJob]) -> dict[str, list[BoundJob]]:
    """The Scheduler jobs of each job of jobs.yaml, by name."""
    found: dict[str, list[BoundJob]] = {}
    for job in sorted(jobs, key=lambda job: (job.declared.name, history_id(job.declared))):
        found.setdefault(job.declared.target, []).append(job)
    return found


def _card_slots(jobs: Sequence[BoundJob], now: datetime.datetime) -> list[Slot]:
    """A card's slots: the newest CARD_SLOTS of the last day of its Scheduler jobs (pauses unread)."""
    day_ago = now - datetime.timedelta(hours=24)
    return [slot for slot in latest_slots(jobs, now, CARD_SLOTS) if slot.schedule_time > day_ago] if jobs else []


def _scheduler_jobs_of(
    jobs: Sequence[BoundJob],
    runs: Sequence[RunRecord],
    slots: Mapping[str, Sequence[Slot]],
    named: Mapping[str, Sequence[BoundJob]],
) -> list[SchedulerJob]:
    """The declared Scheduler jobs a page shows: of its runs, its cards' slots and its cards' lists."""
    wanted = {history_id(slot.job) for of_job in slots.values() for slot in of_job}
    wanted |= {history_id(job.declared) for of_job in named.values() for job in of_job}
    for record in runs:
        if record.scheduler_job_name:
            job = declared_job(jobs, record.scheduler_job_name, record.project, record.location)
            if job is not None:
                wanted.add(history_id(job.declared))
    return [job.declared for job in jobs if history_id(job.declared) in wanted]


UNTRACKED = ExecutionStatus.UNTRACKED
# The statuses of a run that still holds its slot: running, stuck, or either past its finish_within.
HELD = (ExecutionStatus.IN_PROGRESS, ExecutionStatus.OVERDUE, ExecutionStatus.STUCK)


def job_summary(
    job_id: str,
    runs: list[RunRecord],
    unfinished: list[RunRecord],
    now: datetime.datetime,
    expected: Sequence[dict[str, Any]] = (),
    scheduler_jobs: Sequence[dict[str, Any]] = (),
    bound: Sequence[BoundJob] = (),
    scheduler_jobs_total: int | None = None,
) -> dict[str, Any]:
    finished = [r for r in runs if r.status != RunStatus.IN_PROGRESS]
    unfinished_rows = [row(r, now, bound) for r in unfinished]
    completed = [r for r in finished if r.status == RunStatus.COMPLETED]
    durations = [d for d in (duration_seconds(r) for r in finished) if d is not None]
    return {
        "job_id": job_id,
        "runs": len(runs),
        "success_rate": round(100 * len(completed) / len(finished)) if finished else None,
        "median_duration": round(statistics.median(durations), 2) if durations else None,
        # As every view says it: a stuck slot whose window has closed is missed, and listed so.
        # (An overdue one is either, by its lease.)
        "running": [r for r in unfinished_rows if r["outcome"] in HELD and r["lease_left"] is not None][:CARD_RUNNING],
        "running_count": sum(1 for r in unfinished_rows if r["outcome"] in HELD and r["lease_left"] is not None),
        "stuck": [r for r in unfinished_rows if r["outcome"] in HELD[1:] and r["lease_left"] is None],
        "latest": [row(r, now, bound) for r in runs[:5]],
        "scheduled": bool(expected),
        "last_expected": expected[-1] if expected else None,
        # Slots an operator may run by hand, newest first; not those before the job's slots are expected from,
        # which were never expected of the app (the executions API runs them, forced).
        "to_run": [e for e in reversed(expected) if e["status"] in RUNNABLE and e["status"] != UNTRACKED][:5],
        "missed": sum(e["status"] == ExecutionStatus.MISSED for e in expected),
        "conflicts": sum(e["status"] == ExecutionStatus.CONFLICT for e in expected),
        "expected_count": sum(e["status"] != UNTRACKED for e in expected),
        "scheduler_jobs": list(scheduler_jobs),
        # The card names the first CARD_SCHEDULES; the Scheduler jobs table lists them all, with search.
        "scheduler_jobs_more": max(0, (scheduler_jobs_total or len(scheduler_jobs)) - len(scheduler_jobs)),
    }


def timeline(
    runs: list[RunRecord], now: datetime.datetime, gaps: Sequence[Any] = (), jobs: Sequence[BoundJob] = ()
) -> dict[str, Any]:
    """An SVG-ready chart: one row per job, one mark per run at its schedule (or start) time, and a
    hollow mark at each missed slot (``gaps``: (job_id, execution document))."""
    if not runs and not gaps:
        return {"rows": [], "marks": [], "gaps": [], "height": CHART_ROW, "width": CHART_WIDTH, "ticks": []}
    gap_times = [(job_id, parse_rfc3339(e["schedule_time"], "schedule_time")) for job_id, e in gaps]
    declared = jobs
    rows = sorted({r.job_id for r in runs} | {job_id for job_id, _ in gaps})
    times = [(r.schedule_time or r.created) for r in runs]
    all_times = times + [when for _, when in gap_times]
    start, end = min(all_times), max(all_times)
    span = max((end - start).total_seconds(), 1.0)
    plot = CHART_WIDTH - CHART_LEFT - 20

    def x(instant: datetime.datetime) -> float:
        return round(CHART_LEFT + 10 + plot * (instant - start).total_seconds() / span, 1)

    statuses = [run_status(r, declared, now) for r in runs]
    marks = [
        {
            "x": x(when),
            "y": 20 + CHART_ROW * rows.index(r.job_id),
            "outcome": status,
            "run_id": r.run_id,
            "label": f"{r.job_id} {format_utc(when)} {status} (attempt {r.attempt})",
        }
        for r, when, status in zip(runs, times, statuses, strict=True)
    ]
    missed_marks = [
        {"x": x(when), "y": 20 + CHART_ROW * rows.index(job_id), "label": f"{job_id} {format_utc(when)} missed"}
        for job_id, when in gap_times
    ]
    ticks = [
        {"x": x(start), "label": format_utc(start)[:16].replace("T", " "), "anchor": "start"},
        {"x": x(end), "label": format_utc(end)[:16].replace("T", " "), "anchor": "end"},
    ]
    return {
        "rows": [{"job_id": job, "y": 20 + CHART_ROW * i} for i, job in enumerate(rows)],
        "marks": marks,
        "gaps": missed_marks,
        "height": 40 + CHART_ROW * len(rows),
        "width": CHART_WIDTH,
        "ticks": ticks,
    }


@blueprint.get("/jobs/<job_id>/history", provide_automatic_options=False)
@requires(Role.VIEW)
def history(job_id: str):
    """Every expected execution of a job on one day of its time zone (or one hour of it), with
    what became of it, and its runs apart from the slots beside them; by the hour when a day
    holds more than HISTORY_PAGE slots.  ``status`` keeps the slots in that status."""
    state = app_state()
    shown = history_range(state, job_id)
    scheduler_jobs, zone, day, hour = shown.scheduler_jobs, shown.zone, shown.day, shown.hour
    status = request.args.get("status") or None
    if status is not None and status not in set(ExecutionStatus):
        abort(400, f"status {status!r} is none of {', '.join(ExecutionStatus)}")
    now = state.clock.now()
    page = executions_between(state, scheduler_jobs, job_id, shown.since, shown.until, HISTORY_PAGE)
    hours = None
    if shown.by_the_hour(page.next_since is not None):
        hours = hour_counts(state, scheduler_jobs, shown.since, shown.until, zone)
    rows = [
        {**e, "local": _local(e["schedule_time"], zone)}
        for e in page.executions
        if status is None or e["status"] == status
    ]
    apart = [
        {**row(record, now, scheduler_jobs), "local": _local(format_utc(record.created), zone)}
        for record in page.unscheduled
    ]
    apart = [r for r in apart if status is None or r["outcome"] == status]
    return render_template(
        "admin/history.html",
        job_id=job_id,
        zone=shown.zone_name,
        day=day.isoformat(),
        hour=hour,
        ranged=shown.ranged,
        where=shown.where,
        range_shown=(_local(format_utc(shown.since), zone), _local(format_utc(shown.until), zone)),
        previous_day=(day - DAYS).isoformat(),
        next_day=(day + DAYS).isoformat(),
        status=status,
        statuses=list(ExecutionStatus),
        hours=hours.hours if hours else None,
        unread=hours if hours and hours.unread_slots else None,
        next_page=_next_page(job_id, shown, status, page.next_since) if page.next_since and hours is None else None,
        rows=sorted(rows + apart, key=lambda r: r["local"]) if hours is None else [],
        apart=len(apart),
        scheduler_jobs=sorted({job.declared.name for job in scheduler_jobs}),
        schedules=sorted({(job.declared.name, job.declared.schedule) for job in scheduler_jobs}),
        shapes=MARK_SHAPES,
        legend=LEGEND,
        bulk=_bulk_offer(job_id, shown, page.executions) if hours is None and may(Role.OPERATE) else None,
        bulk_said=_bulk_said(request.args.get("bulk")),
        # What the range's slots came to, for "did last night run, once each?" at a glance.
        summary=_summary(page.executions) if hours is None else None,
        # A range longer than a page: the summary and the listing are this page's, and say so.
        paged=hours is None and (page.next_since is not None or bool(request.args.get("from"))),
    )


def _next_page(job_id: str, shown: HistoryRange, status: str | None, since: datetime.datetime) -> str:
    where: dict[str, Any] = {**shown.where, "status": status, "from": format_utc(since)}
    return link("admin.history", {"job_id": job_id}, where)


def _summary(executions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    counted = [e for e in executions if e["status"] not in (ExecutionStatus.UNTRACKED, ExecutionStatus.UPCOMING)]
    by_status: dict[str, int] = {}
    for e in counted:
        by_status[e["status"]] = by_status.get(e["status"], 0) + 1
    ran_once, ran_more = ran_once_or_more(counted)
    return {
        "expected": len(counted),
        "ran_once": ran_once,
        "ran_more": ran_more,
        "by_status": dict(sorted(by_status.items())),
    }


def _bulk_offer(job_id: str, shown: HistoryRange, executions: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    chosen = bulk_slots(executions)
    if not chosen:
        return None
    where = shown.link_fields(request.args.get("from"))
    return {"count": len(chosen), "link": link("dashboard_actions.confirm_bulk_run", {"job_id": job_id}, where)}


def _bulk_said(text: str | None) -> dict[str, int] | None:
    """``?bulk=Q-A-R``, a bulk run's answer: queued, answered by their records, refused."""
    parts = (text or "").split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts):
        return None
    queued, answered, refused = map(int, parts)
    return {"queued": queued, "answered": answered, "refused": refused}


def _local(utc_text: str, zone: Any) -> str:
    """An instant in the job's time zone, to the second: what a person reads."""
    return parse_rfc3339(utc_text, "time").astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")


@blueprint.get("/search", provide_automatic_options=False)
@requires(Role.VIEW)
def search() -> WerkzeugResponse:
    """A 303 to what ``q`` names: a run's page (a run id, or a manual run's client token), or the
    history of a job named in jobs.yaml or of a Scheduler job's target.

    A client token is stored unindexed, but a manual run's id is derived from it and its job, so
    the runs a token names are one batched lookup of each job's run id for it, never a query.
    The rest reads nothing: a run id's page says if it is gone."""
    wanted = (request.args.get("q") or "").strip()
    if not wanted:
        abort(400, "search for a run id (64 hex digits), a job of jobs.yaml or a Scheduler job of scheduler.yaml")
    state = app_state()
    if is_run_id(wanted.lower()):
        return redirect(url_for("admin.run_page", run_id=wanted.lower()), code=303)
    if wanted in state.jobs:
        return redirect(url_for("admin.history", job_id=wanted), code=303)
    named = sorted({job.target for job in state.schedules if job.name == wanted})
    if len(named) == 1:
        return redirect(url_for("admin.history", job_id=named[0]), code=303)
    if client_token_problem(wanted) is None:
        found = runs_of_token(state, wanted)
        if len(found) == 1:
            return redirect(url_for("admin.run_page", run_id=found[0].run_id), code=303)
        if found:  # one token used with several jobs: each is its own run
            # Each shown with the one status every view gives it (a lost lease is stuck, not in_progress).
            bound, now = state.with_pauses(), state.clock.now()
            shown_runs = [{"run": r, "status": run_status(r, bound, now)} for r in found]
            return make_response(render_template("admin/search.html", wanted=wanted, runs=shown_runs))
    shown = wanted if len(wanted) <= 100 else wanted[:100] + "…"
    abort(
        404,
        f"no run id, job, Scheduler job or client token of a manual run is {shown!r} "
        "(a manual run is kept an hour after it finishes)",
    )
