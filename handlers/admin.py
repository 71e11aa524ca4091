"""``/admin/``: the operator dashboard, server-rendered (no front-end build step).

What ran, what is running (and how long its lease has left), what is stuck
(lease over, not finished) and what failed, per job, with a timeline that
reads at a glance.  Every value goes through Jinja's autoescaping:
downstream error bodies are untrusted data.
"""

from __future__ import annotations

import datetime
import json
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flask import Blueprint, Response, abort, jsonify, make_response, redirect, render_template, request, url_for
from markupsafe import Markup, escape
from werkzeug.wrappers import Response as WerkzeugResponse

from dedup.keys import EARLIEST_SCHEDULE_TIME, LATEST_SCHEDULE_TIME, format_utc, is_run_id, parse_rfc3339
from dedup.queries import RunFilter
from dedup.steps import review_step, step_rows
from handlers.access import Role, requires
from handlers.client_tokens import client_token_problem, new_form_token
from handlers.history_range import (
    BULK_LIMIT,
    BULK_STATUSES,
    COUNTED_DAYS,
    DAYS,
    HISTORY_PAGE,
    HistoryRange,
    bulk_slots,
    history_range,
)
from handlers.job_cards import CARD_SCHEDULER_JOBS, CardCounts, job_cards, strip_colour
from handlers.job_rows import SEARCH_MAX, SHOWN_ORDER, PageOutOfRange, job_rows, row_page
from handlers.links import link
from handlers.request_times import BadTime, request_time
from handlers.run_documents import deliveries_of, duration_seconds, may_retry, run_document, scheduler_job_document
from handlers.slot_statuses import LEGEND, MARK_SHAPES, NEEDS_ATTENTION
from handlers.state import app_state, may
from models import RunRecord, RunSource, RunStatus
from schedules.bound import BoundJob
from schedules.config import SchedulerJob, history_id, schedule_zone
from schedules.pauses import current
from schedules.slots import (
    RUNNABLE,
    ExecutionStatus,
    Slot,
    declared_job,
    is_slot,
    ran_once_or_more_of,
    run_status,
    schedule_at,
    shown_status,
    slot_of_run,
    slots_between,
)
from schedules.tallies import DELIVERIES_LISTED, deliveries_of_slot
from service.errors import Invalid
from service.hours import SLOT_BUDGET, UNREAD, JudgedJob, count_hours, in_status, judged_slots
from service.runs import runs_of_token
from service.slots import executions_between, external_of
from service.window import Window, window_of

blueprint = Blueprint("admin", __name__, url_prefix="/admin", template_folder="templates")
# ``/``: where a browser pointed at the app's address lands.
home = Blueprint("home", __name__)

RUNS_PAGE = 20  # the runs list's page: a phone's screenful or two, paged with a cursor
CARD_RUNNING_READ = 50  # the runs in progress a card reads (it names CARD_RUNNING, every stuck one)
# The run page shows at most this much of each stored document, as escaped HTML
# (pretty-printed and escaped it can grow several times over); the run API has it all.
MAX_SHOWN_DOCUMENT_BYTES = 128 * 1024
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
    """The home page over one window the operator chose (``window``: the last 24 hours, last night,
    or a range of days; service.window): the rows, the cards, the timeline and the runs list all
    count and list that window, and say so."""
    state = app_state()
    now = state.clock.now()
    chosen = {name: request.args.get(name) or None for name in ("job", "status", "source")}
    if chosen["status"] not in (None, *SHOWN_STATUSES) or chosen["source"] not in (
        None,
        *[s.value for s in RunSource],
    ):
        abort(400, "unknown status or source")
    try:
        window = window_of(request.args, state.night, now)
    except Invalid as bad:
        abort(400, bad.message)
    # A status the legend shows is filtered by as every view shows it (run_status): a stored one is
    # asked of the query too; a derived one (stuck, late, overdue) is found among the page's runs.
    stored = chosen["status"] if chosen["status"] in set(RunStatus) else None
    # The runs list's later pages keep the bounds its first page had (``runs_until``): the last 24
    # hours move with the clock, and a cursor belongs to the query that made it.
    runs_until = window.until
    if request.args.get("runs_until"):
        try:
            runs_until = request_time("runs_until", request.args["runs_until"])
        except BadTime as bad:
            abort(400, bad.message)
    runs_since = runs_until - window.span
    try:
        run_filter = RunFilter(
            job_id=chosen["job"], status=stored, source=chosen["source"], since=runs_since, until=runs_until
        )
    except ValueError as exc:
        abort(400, str(exc).replace("job_id", "job"))
    if chosen["job"] and chosen["job"] not in state.jobs:
        abort(404, f"jobs.yaml has no job {chosen['job']!r}: {', '.join(sorted(state.jobs))}")
    search, page_text = request.args.get("q") or "", request.args.get("page") or "1"
    if len(search) > SEARCH_MAX:
        abort(400, f"a search (q) is at most {SEARCH_MAX} characters")
    if not (page_text.isascii() and page_text.isdigit() and len(page_text) <= 6):
        abort(400, "page must be a whole number, 1 or more")
    runs_from = request.args.get("runs_from") or None
    if runs_from is not None and not (len(runs_from) <= 500 and runs_from.isascii()):
        abort(400, "runs_from must be the cursor a page of runs linked to")
    try:
        recent, next_runs = state.ledger.find_runs(run_filter, RUNS_PAGE, runs_from)
    except Exception as exc:  # a cursor that is not one Datastore made (edited, truncated): say so
        if runs_from is None:
            raise
        abort(400, f"runs_from is not a cursor of this page's runs ({type(exc).__name__})")
    carded = [job_id for job_id in sorted(state.jobs) if not chosen["job"] or job_id == chosen["job"]]
    # Every run still in progress of each card, however old (a stuck one must not hide behind
    # newer runs): the queries of every card sent at once, one round trip for all.
    unfinished = state.ledger.find_runs_together(
        [RunFilter(job_id=job_id, status=RunStatus.IN_PROGRESS) for job_id in carded], CARD_RUNNING_READ
    )
    schedules_of_job = _schedules_by_target(state.bound_schedules)
    named = {job_id: schedules_of_job.get(job_id, [])[:CARD_SCHEDULES] for job_id in carded}
    shown_runs = [*recent, *(record for page in unfinished for record in page)]
    card_jobs = {
        job_id: schedules_of_job.get(job_id, [])
        for job_id in carded
        if len(schedules_of_job.get(job_id, [])) <= CARD_SCHEDULER_JOBS
    }
    try:
        rows_shown = row_page(state, now, int(page_text), search, chosen["job"])
    except PageOutOfRange as exc:
        abort(400, str(exc))
    # Every Scheduler job the page shows (its runs', its cards', its rows'), bound to its pauses in
    # one lookup, and the slots of the window of those it counts judged together: two lookups more.
    bound = state.with_pauses(
        _scheduler_jobs_of(state.bound_schedules, shown_runs, card_jobs, named, {"": rows_shown.shown})
    )
    by_id = {history_id(job.declared): job for job in bound}
    counted_ids = list(
        dict.fromkeys(
            [history_id(job.declared) for of_job in card_jobs.values() for job in of_job]
            + [history_id(job.declared) for job in rows_shown.shown]
        )
    )
    judged = judged_slots(state, [by_id[i] for i in counted_ids], window.since, window.counted_until(now))
    judged_by_id = {history_id(one.job.declared): one for one in judged}
    if chosen["status"]:
        recent = [record for record in recent if run_status(record, bound, now) == chosen["status"]]
    # The cards count their Scheduler jobs bound to their pauses (a paused slot is not missed).
    of_cards = {
        job_id: [by_id[history_id(job.declared)] for job in card_jobs[job_id]]
        if job_id in card_jobs
        else schedules_of_job.get(job_id, [])
        for job_id in carded
    }
    counted = job_cards(state, of_cards, window, now, judged_by_id)
    summaries = [
        job_summary(
            job_id,
            unfinished[index],
            now,
            counted[job_id],
            [scheduler_job_document(by_id[history_id(job.declared)]) for job in named[job_id]],
            bound,
        )
        for index, job_id in enumerate(carded)
    ]
    rows = job_rows(state, [by_id[history_id(job.declared)] for job in rows_shown.shown], now, window, judged_by_id)
    return render_template(
        "admin/dashboard.html",
        now=format_utc(now),
        window=window,
        night=state.night,
        summaries=summaries,
        job_rows=rows,
        row_page=rows_shown,
        search=search,
        chosen=chosen,
        sources=[source.value for source in RunSource],
        runs=[row(record, now, bound) for record in recent],
        next_runs=link(
            "admin.dashboard",
            {},
            {**_kept(chosen, search, window), "runs_from": next_runs, "runs_until": format_utc(runs_until)},
        )
        if next_runs
        else None,
        first_runs=link("admin.dashboard", {}, _kept(chosen, search, window)) if runs_from else None,
        runs_page=RUNS_PAGE,
        kept=_kept(chosen, search, window),
        job_ids=sorted(state.jobs),
        # External jobs' handlers run them elsewhere: no Run now on their cards, and why.
        external={job_id: job.runner.external.url for job_id, job in state.jobs.items() if job.runner.external},
        statuses=list(SHOWN_STATUSES),
        # A slot with no run (due, upcoming, ...) is in no runs list: its history lists it.
        status_without_runs=chosen["status"] in SLOT_ONLY_STATUSES,
        can_operate=may(Role.OPERATE),
        new_form_token=new_form_token,
        shapes=MARK_SHAPES,
        legend=LEGEND,
        strip_colour=strip_colour,
        attention=[str(status) for status in NEEDS_ATTENTION] + [UNREAD],
        said=_said(request.args.get("said"), request.args.get("scheduler_job"), bound),
        window_since=format_utc(window.since),
        window_until=format_utc(window.counted_until(now)),
    )


def _said(said: str | None, name: str | None, bound: Sequence[BoundJob]) -> dict[str, Any] | None:
    """What a pause or resume that led here did (``said``: paused, or resumed-N with the slots its
    catch-up queued, resumed-1-C for one run standing for C more), of the Scheduler job ``name``,
    with its pause as it stands now."""
    if not said or not name:
        return None
    job = next((job for job in bound if job.declared.name == name), None)
    if job is None:
        return None
    lasting = current(job.pauses)
    if said == "paused":  # a link kept after a resume says nothing: the row says the state as it is
        return {"kind": "paused", "name": name, "pause": lasting.document()} if lasting else None
    kind, _, counts = said.partition("-")
    count, _, covered = counts.partition("-")  # resumed-N, or resumed-1-C for a compacted catch-up
    numbers = [count, *([covered] if covered else [])]
    if kind != "resumed" or not all(n.isascii() and n.isdigit() and len(n) <= 6 for n in numbers):
        return None
    return {
        "kind": "resumed",
        "name": name,
        "caught_up": int(count),
        "covered": int(covered) if covered else 0,
        "paused_again": lasting is not None,
    }


def _kept(chosen: Mapping[str, str | None], search: str, window: Window) -> dict[str, str]:
    """The query that shows this page again: its window, filters and search."""
    return {**window.fields, **{k: v for k, v in chosen.items() if v}, **({"q": search} if search else {})}


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
    review = review_step(record) if not waiting else None  # an at_most_once step whose outcome is unknown
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
        # While the attempt an action queued has not started, the run is "queued", not what its last
        # attempt came to (a red "failed" beside "queued" read as two answers).
        outcome="queued" if waiting else "needs_review" if review else status,
        steps=step_rows(record.steps, run_id),
        review=review,
        review_entry=(record.steps or {}).get(review["step"]) if review else None,
        # Its decision reopens the run as a run of its slot does: a scheduled slot's run only.
        # An external job's run is its own handler's, which reopens nothing (service.slots.check_slot_run).
        may_settle=review is not None
        and slot is not None
        and external_of(state, record.job_id) is None
        and may(Role.OPERATE),
        form_used=request.args.get("answer") in ("form_used", "form_running"),
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
        may_retry=not waiting and may(Role.OPERATE) and may_retry(record, state.jobs),
        # A scheduled run that failed or was skipped may be run again under its slot's key (not while
        # a run of it is queued: that is the run again).
        run_again=slot if slot and not waiting and may(Role.OPERATE) and status in RUNNABLE else None,
        stuck=_stuck_facts(record, slot, now) if status == ExecutionStatus.STUCK and not waiting else None,
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
    "form_used": "This form was already used: it started this run, so nothing ran again. "
    "For a new run, reload the dashboard and press Run now.",
    "form_running": "This form was already used: the run it started is still going, so nothing ran again. "
    "For a new run, reload the dashboard and press Run now.",
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


def _schedules_by_target(jobs: Sequence[BoundJob]) -> dict[str, list[BoundJob]]:
    """The Scheduler jobs of each job of jobs.yaml, by name."""
    found: dict[str, list[BoundJob]] = {}
    for job in sorted(jobs, key=lambda job: (job.declared.name, history_id(job.declared))):
        found.setdefault(job.declared.target, []).append(job)
    return found


def _scheduler_jobs_of(
    jobs: Sequence[BoundJob],
    runs: Sequence[RunRecord],
    *shown: Mapping[str, Sequence[BoundJob]],
) -> list[SchedulerJob]:
    """The declared Scheduler jobs a page shows: of its runs, and of its cards (counted or named)."""
    wanted = {history_id(job.declared) for of_jobs in shown for of_job in of_jobs.values() for job in of_job}
    for record in runs:
        if record.scheduler_job_name:
            job = declared_job(jobs, record.scheduler_job_name, record.project, record.location)
            if job is not None:
                wanted.add(history_id(job.declared))
    return [job.declared for job in jobs if history_id(job.declared) in wanted]


# The statuses of a run that still holds its slot: running, stuck, or either past its finish_within.
HELD = (ExecutionStatus.IN_PROGRESS, ExecutionStatus.OVERDUE, ExecutionStatus.STUCK)


def job_summary(
    job_id: str,
    unfinished: list[RunRecord],
    now: datetime.datetime,
    counted: CardCounts,
    scheduler_jobs: Sequence[dict[str, Any]] = (),
    bound: Sequence[BoundJob] = (),
) -> dict[str, Any]:
    """A job's card: the window's counts of its slots (job_cards), and what holds a slot now."""
    unfinished_rows = [row(r, now, bound) for r in unfinished]
    return {
        "job_id": job_id,
        "counted": counted,
        # As every view says it: running while the lease holds, stuck once it is over.
        "running": [r for r in unfinished_rows if r["outcome"] in HELD and r["lease_left"] is not None][:CARD_RUNNING],
        "running_count": sum(1 for r in unfinished_rows if r["outcome"] in HELD and r["lease_left"] is not None),
        "stuck": [r for r in unfinished_rows if r["outcome"] in HELD[1:] and r["lease_left"] is None],
        "scheduled": counted.scheduler_jobs > 0,
        "scheduler_jobs": list(scheduler_jobs),
        # The card names the first CARD_SCHEDULES; the Scheduler jobs table lists them all, with search.
        "scheduler_jobs_more": max(0, counted.scheduler_jobs - len(scheduler_jobs)),
    }


@blueprint.get("/jobs/<job_id>/history", provide_automatic_options=False)
@requires(Role.VIEW)
def history(job_id: str):
    """Every expected execution of a job on one day of its time zone (or one hour of it, or a range),
    with what became of it, and its runs apart from the slots beside them; by the hour when a day
    holds more than HISTORY_PAGE slots.  ``status`` lists the slots of the range in that status,
    paged, with their total; ``scheduler_job`` keeps one Scheduler job's (a home row's counts)."""
    state = app_state()
    shown = history_range(state, job_id)
    scheduler_jobs, zone, day, hour = shown.scheduler_jobs, shown.zone, shown.day, shown.hour
    status = request.args.get("status") or None
    if status is not None and status not in set(ExecutionStatus):
        abort(400, f"status {status!r} is none of {', '.join(ExecutionStatus)}")
    now = state.clock.now()
    # What the whole range came to (up to COUNTED_DAYS of it): the total every page says, judged
    # from the day summaries and the records they do not speak for, capped (service.hours).
    counted_until = min(shown.until, shown.range_start + COUNTED_DAYS)
    listing = None
    hours = None
    judged: list[JudgedJob] | None = None
    page = None
    if status is not None:
        judged = judged_slots(state, scheduler_jobs, shown.range_start, counted_until)
        listing = in_status(judged, status, shown.since, STATUS_PAGE)
        rows = [
            {
                "schedule_time": format_utc(slot.schedule_time),
                "scheduler_job": slot.job.name,
                "status": status,
                "run_id": slot.run_id,
                "run": {"attempt": attempt} if attempt is not None else None,
                "local": _local(format_utc(slot.schedule_time), zone),
            }
            for slot, attempt in listing.slots
        ]
        apart: list[dict[str, Any]] = []
    elif shown.by_the_hour(
        len(slots_between(scheduler_jobs, shown.since, shown.until, HISTORY_PAGE + 1)) > HISTORY_PAGE
    ):
        # A day of more slots than a page is counted by the hour from its judged slots: no slot is
        # listed, so no page of records is read (a per-minute day costs about a 5-minute one).
        judged = judged_slots(state, scheduler_jobs, shown.range_start, counted_until)
        hours = count_hours(judged, zone)
        rows, apart = [], []
    else:
        page = executions_between(state, scheduler_jobs, job_id, shown.since, shown.until, HISTORY_PAGE)
        if page.next_since is not None or shown.since > shown.range_start:  # the range is more than this page
            judged = judged_slots(state, scheduler_jobs, shown.range_start, counted_until)
        rows = [{**e, "local": _local(e["schedule_time"], zone)} for e in page.executions]
        apart = [
            {**row(record, now, scheduler_jobs), "local": _local(format_utc(record.created), zone)}
            for record in page.unscheduled
        ]
    next_since = listing.next_from if listing is not None else page.next_since if page is not None else None
    whole = judged is not None and counted_until >= shown.until
    return render_template(
        "admin/history.html",
        job_id=job_id,
        zone=shown.zone_name,
        day=day.isoformat(),
        hour=hour,
        ranged=shown.ranged,
        where=shown.where,
        range_shown=(_local(format_utc(shown.range_start), zone), _local(format_utc(shown.until), zone)),
        previous_day=(day - DAYS).isoformat(),
        next_day=(day + DAYS).isoformat(),
        status=status,
        statuses=list(ExecutionStatus),
        hours=hours.hours if hours else None,
        unread=hours if hours and hours.unread_slots else None,
        listing=listing,
        next_page=_next_page(job_id, shown, status, next_since) if next_since and hours is None else None,
        rows=sorted(rows + apart, key=lambda r: r["local"]) if hours is None else [],
        apart=len(apart),
        scheduler_jobs=sorted({job.declared.name for job in scheduler_jobs}),
        chosen_scheduler_job=shown.where.get("scheduler_job"),
        schedules=sorted({(job.declared.name, job.declared.schedule) for job in scheduler_jobs}),
        shapes=MARK_SHAPES,
        legend=LEGEND,
        bulk=_bulk_offer(job_id, shown, judged, page) if may(Role.OPERATE) else None,
        bulk_said=_bulk_said(request.args.get("bulk")),
        # What the range's slots came to, for "did last night run, once each?" at a glance: the
        # whole range's (up to COUNTED_DAYS), else this page's when the page is the range.
        summary=_judged_summary(judged) if judged is not None else _summary(page.executions) if page else None,
        slot_budget=SLOT_BUDGET,
        summary_whole=whole or (judged is None and page is not None and page.next_since is None),
        counted_until=_local(format_utc(counted_until), zone) if judged is not None and not whole else None,
    )


STATUS_PAGE = 100  # the slots of one status a page lists


def _judged_summary(judged: Sequence[JudgedJob]) -> dict[str, Any]:
    """``_summary_of`` the judged slots of a range, and how many Scheduler jobs went uncounted."""
    pairs = ((shown, attempt) for one in judged for shown, attempt in zip(one.statuses, one.attempts, strict=True))
    # Scheduler jobs past what one count judges (service.hours.SLOT_BUDGET): in no figure.
    return {**_summary_of(pairs), "uncounted": sum(1 for one in judged if not one.counted)}


def _next_page(job_id: str, shown: HistoryRange, status: str | None, since: datetime.datetime) -> str:
    where: dict[str, Any] = {**shown.where, "status": status, "from": format_utc(since)}
    return link("admin.history", {"job_id": job_id}, where)


def _summary(executions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``_summary_of`` a page's slots (execution documents)."""
    return _summary_of((e["status"], (e.get("run") or {}).get("attempt")) for e in executions)


def _summary_of(slots: Iterable[tuple[str, int | None]]) -> dict[str, Any]:
    """What slots (status, attempt) came to: every one up to now by status, adding up to
    "expected", and of the completed, how many ran once (schedules.slots.ran_once_or_more_of)."""
    counted = [(status, attempt) for status, attempt in slots if status != ExecutionStatus.UPCOMING]
    by_status = Counter(status for status, _ in counted)
    ran_once, ran_more = ran_once_or_more_of(counted)
    return {
        "expected": len(counted),
        "ran_once": ran_once,
        "ran_more": ran_more,
        "by_status": {status: by_status[status] for status in SHOWN_ORDER if by_status[status]},
    }


def _bulk_offer(
    job_id: str, shown: HistoryRange, judged: Sequence[JudgedJob] | None, page: Any
) -> dict[str, Any] | None:
    """The range's missed and failed slots to run in one confirmation: the whole range's when it
    was judged, else this page's."""
    if judged is not None:
        count = sum(one.statuses.count(status) for one in judged for status in BULK_STATUSES)
    else:
        count = len(bulk_slots(page.executions)) if page is not None else 0
    if not count:
        return None
    return {
        "count": count,
        "runs": min(count, BULK_LIMIT),
        "link": link("dashboard_actions.confirm_bulk_run", {"job_id": job_id}, shown.where),
    }


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
    """A 303 to what ``q`` names, or a list when it names several, searched for by what the pages
    show (issue 39 §8): a run id or the first characters of one (at least MIN_ID_PREFIX, as the
    tables show 12), a job of jobs.yaml, a Scheduler job by name or by its whole resource name
    (``projects/P/locations/L/jobs/NAME``), a slot time (``2030-01-13 03:00``, RFC 3339 too; UTC
    unless it says otherwise) alone or after a job's name, or a manual run's client token.

    A client token is stored unindexed, but a manual run's id is derived from it and its job, so
    the runs a token names are one batched lookup of each job's run id for it, never a query.  A
    miss is a 404 page that keeps the query in the box and says what it was searched as."""
    wanted = (request.args.get("q") or "").strip()
    if not wanted:
        abort(
            400,
            "search for a run id (or its first 12 characters), a job, a Scheduler job, a slot time or a client token",
        )
    state = app_state()
    bound, now = None, state.clock.now()
    lowered = wanted.lower()
    searched = []
    if is_run_id(lowered):
        return redirect(url_for("admin.run_page", run_id=lowered), code=303)
    if MIN_ID_PREFIX <= len(lowered) < 64 and all(c in "0123456789abcdef" for c in lowered):
        searched.append("the start of a run id")
        found = state.ledger.runs_starting(lowered, PREFIX_MATCHES + 1)
        if len(found) == 1:
            return redirect(url_for("admin.run_page", run_id=found[0].run_id), code=303)
        if found:
            bound = state.with_pauses()
            listed = [{"run": r, "status": run_status(r, bound, now)} for r in found[:PREFIX_MATCHES]]
            return make_response(
                render_template(
                    "admin/search.html", wanted=wanted, runs=listed, why="prefix", more=len(found) > PREFIX_MATCHES
                )
            )
    if wanted in state.jobs:
        return redirect(url_for("admin.history", job_id=wanted), code=303)
    searched += ["a job", "a Scheduler job"]
    named = _scheduler_jobs_named(state.schedules, wanted)
    if len(named) == 1:
        return redirect(url_for("admin.history", job_id=named[0].target, scheduler_job=named[0].name), code=303)
    if len(named) > 1 and len({job.target for job in named}) == 1:
        return redirect(url_for("admin.history", job_id=named[0].target), code=303)
    slot_time = _slot_time_of(wanted)
    if slot_time is not None:
        searched.append("a slot time")
        instant, of = slot_time
        slots = _slots_at(state, instant, of)
        if slots is not None:
            return slots
    if client_token_problem(wanted) is None:
        searched.append("a client token")
        found = runs_of_token(state, wanted)
        if len(found) == 1:
            return redirect(url_for("admin.run_page", run_id=found[0].run_id), code=303)
        if found:  # one token used with several jobs: each is its own run
            # Each shown with the one status every view gives it (a lost lease is stuck, not in_progress).
            bound = bound or state.with_pauses()
            shown_runs = [{"run": r, "status": run_status(r, bound, now)} for r in found]
            return make_response(render_template("admin/search.html", wanted=wanted, runs=shown_runs, why="token"))
    shown = wanted if len(wanted) <= 100 else wanted[:100] + "…"
    abort(
        404,
        f"nothing matches {shown!r}, searched as {', '.join(searched)} "
        "(a manual run is kept an hour after it finishes, a run id prefix needs "
        f"{MIN_ID_PREFIX} hex digits, a slot time reads 2030-01-13 03:00 in UTC)",
    )


MIN_ID_PREFIX = 8  # the shortest start of a run id searched for (the tables show 12 characters)
PREFIX_MATCHES = 20  # the runs a prefix lists at most
_TIME_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


def _scheduler_jobs_named(schedules: Sequence[SchedulerJob], wanted: str) -> list[SchedulerJob]:
    """The declared Scheduler jobs ``wanted`` names: by name, or by whole resource name."""
    parts = wanted.split("/")
    if len(parts) == 6 and parts[0] == "projects" and parts[2] == "locations" and parts[4] == "jobs":
        return [j for j in schedules if (j.project, j.location, j.name) == (parts[1], parts[3], parts[5])]
    return [job for job in schedules if job.name == wanted]


def _slot_time_of(wanted: str) -> tuple[datetime.datetime, str | None] | None:
    """A slot time, alone or after a job's or Scheduler job's name: (the instant in UTC, the name)."""
    name, _, rest = wanted.partition(" ")
    for text, of in ((wanted, None), (rest.strip(), name)):
        instant = _instant(text)
        if instant is not None:
            return instant, of
    return None


def _instant(text: str) -> datetime.datetime | None:
    """``text`` as a time a slot may have (the schedule times a key may carry), else None."""
    text = text.strip().removesuffix(" UTC")
    found = None
    try:
        found = parse_rfc3339(text, "q")
    except ValueError:
        bare = text.removesuffix("Z")
        for pattern in _TIME_FORMATS:
            try:
                found = datetime.datetime.strptime(bare, pattern).replace(tzinfo=datetime.UTC)
                break
            except ValueError:
                continue
    # Outside the keyable years no slot has a key (and croniter cannot step past year 1 or 9999).
    return found if found is not None and EARLIEST_SCHEDULE_TIME <= found < LATEST_SCHEDULE_TIME else None


def _slots_at(state: Any, instant: datetime.datetime, of: str | None) -> WerkzeugResponse | None:
    """The slots at ``instant`` of every Scheduler job (or of those ``of`` names): one, its run's
    page (or its history's hour, when it has no run); several, a list; none, None."""
    jobs = [
        job
        for job in state.bound_schedules
        if of is None or job.declared.target == of or of in (job.declared.name, _resource_name(job.declared))
    ]
    if of is not None and not jobs:
        return None
    slots = [Slot(schedule_at(job, instant), instant, job) for job in jobs if is_slot(job, instant)]
    if not slots:
        return None
    records = state.ledger.lookup_many([slot.run_id for slot in slots])
    now = state.clock.now()
    if len(slots) == 1:
        slot = slots[0]
        if slot.run_id in records:
            return redirect(url_for("admin.run_page", run_id=slot.run_id), code=303)
        local = instant.astimezone(schedule_zone(slot.job.time_zone))
        where = {"day": local.date().isoformat(), "hour": local.hour, "scheduler_job": slot.job.name}
        return redirect(link("admin.history", {"job_id": slot.job.target}, where), code=303)
    shown = slots[:PREFIX_MATCHES]
    paused = {history_id(b.declared): b for b in state.with_pauses([s.bound.declared for s in shown if s.bound])}
    listed = []
    for slot in shown:
        with_pauses = Slot(slot.job, instant, paused.get(history_id(slot.job), slot.bound))
        status = shown_status(with_pauses, records.get(slot.run_id), now)
        listed.append({"slot": slot, "status": str(status), "run": records.get(slot.run_id)})
    return make_response(
        render_template(
            "admin/search.html",
            wanted=format_utc(instant),
            wanted_until=format_utc(instant + datetime.timedelta(seconds=1)),
            slots=listed,
            runs=[],
            why="slot time",
        )
    )


def _resource_name(job: SchedulerJob) -> str:
    return f"projects/{job.project}/locations/{job.location}/jobs/{job.name}"
