"""The dashboard's actions: **Run now** on a job, **Retry** on a failed manual run, **run** on a slot,
and **Pause** and **Resume** on a Scheduler job.

Plain server-rendered forms (no script, no build step).  Run now carries a
client token made when the page was rendered, Retry the failed run's own
(``retry_token``), so a double click, a refresh or a resubmitted form is one
run: the action runs through the manual-run path of the run API
(``run_manually``) under that token, and answers with a 303 to the run's
page (POST-redirect-GET).  Only operators see the buttons;
anyone else who posts gets the gate's 403.  Cross-site posts never get here
(``handlers.cross_site``).
"""

from __future__ import annotations

import json
from typing import Any, assert_never

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from dedup.adapters.flask_guard import Fingerprint, GuardRejected
from dedup.adapters.flask_json import InvalidJson, strict_json
from dedup.idempotency import fingerprint
from dedup.keys import format_utc
from dedup.outcomes import (
    Conflict,
    Contended,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Released,
    Replayed,
    RunOutcome,
    Skipped,
    Stale,
)
from dispatch import DispatchError
from handlers.access import Role, requires
from handlers.answers import note_outcome, page_status
from handlers.client_tokens import client_token_problem, new_form_token, retry_token
from handlers.for_people import spelled
from handlers.history_range import BULK_LIMIT, BULK_STATUSES, COUNTED_DAYS, history_range
from handlers.links import link
from handlers.logs import note_run
from handlers.request_times import BadTime, request_time
from handlers.state import app_state, current_principal
from jobs.config import JobSpec
from models import RunSource
from schedules.slots import NEEDS_FORCE, ExecutionStatus, Slot, execution_status
from service.errors import Declined, Invalid, NotFound
from service.hours import judged_slots
from service.pauses import (
    CATCH_UP,
    ScheduleChangeRequest,
    catch_up_preview,
    pause_schedule,
    resume_schedule,
    scheduler_job_named,
)
from service.runs import ManualRunRequest, Queued, manually_runnable, retry_of, run_manually_later
from service.slots import SlotRunRequest, external_of, run_slot_later, run_slots_later, slot_of, stuck_words
from service.steps import StepReview, result_from_text, settle_step

blueprint = Blueprint("dashboard_actions", __name__, url_prefix="/admin", template_folder="templates")

FORM_TYPE = "application/x-www-form-urlencoded"
RUN_NOW_FIELDS = frozenset({"clientToken", "parameters"})
RETRY_FIELDS: frozenset[str] = frozenset()  # the token is the failed run's (retry_token)


class FormProblem(Exception):
    """A form not sent as a form (415): HTTP's own refusal, before there is a request to read.
    A form that is sent but breaks a rule is the service's ``Invalid``, answered by the table."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# What a page answers without a run to show: a form not sent as one, or a refusal (the table's).
REFUSED = (FormProblem, NotFound, Invalid, Declined)


@blueprint.post("/jobs/<job_id>/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def run_now(job_id: str) -> Response | tuple[str, int]:
    try:
        job = manually_runnable(app_state(), job_id)
        note_run(job_id=job_id, source=RunSource.API)
        fields = form_fields(RUN_NOW_FIELDS)
        ask = ManualRunRequest(form_token(fields), form_parameters(fields.get("parameters", "")))
    except REFUSED as refused:
        return refused_page(refused)
    return dispatch_manual_run(job_id, job, ask)


@blueprint.get("/jobs/<job_id>/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_run_now(job_id: str) -> Response | str | tuple[str, int]:
    """Run now's confirmation: the job, what it calls, the parameters.

    The form's token comes from the link (made when the dashboard was rendered), so going back
    to this page and sending it again, even where the browser fetches the page anew, is the
    same run; a link without one gets a fresh token."""
    try:
        job = manually_runnable(app_state(), job_id)
    except (NotFound, Declined) as refused:
        return refused_page(refused)
    token = request.args.get("token")
    if not token:
        # A link without a token (typed, bookmarked) gets one in its URL, so going back to the
        # page and sending it again is still one run even where the browser fetches it anew.
        return redirect(url_for("dashboard_actions.confirm_run_now", job_id=job_id, token=new_form_token()), code=303)
    if client_token_problem(token):
        return refused_page(Invalid(f"the link's {client_token_problem(token)}; reload the dashboard for a new one"))
    return render_template(
        "admin/confirm.html",
        title=f"Run {job_id} now?",
        job_id=job_id,
        calls=job.runner.calls(),
        facts=["A manual run: no Scheduler slot is taken, and Cloud Scheduler's own deliveries still run."],
        action=url_for("dashboard_actions.run_now", job_id=job_id),
        hidden={"clientToken": token},
        parameters="{}",
        force=None,
        button=f"Run {job_id} now",
        back=url_for("admin.dashboard", job=job_id),
    )


def dispatch_manual_run(job_id: str, job: JobSpec, ask: ManualRunRequest) -> Response | tuple[str, int]:
    """Queue the run and answer with its page at once; a run the record already answers (done,
    running, another form's) is answered from it, and nothing is queued."""
    try:
        done = run_manually_later(app_state(), current_principal(), job_id, job, ask)
    except DispatchError as exc:
        resend = {"job_id": job_id, "token": ask.client_token, "parameters": json.dumps(ask.parameters)}
        return problem_page(502, f"the task queue did not take the run ({exc}); send the form again", resend=resend)
    if isinstance(done, Queued):
        return to_queued(done.run_id, done.seen_attempt, sent=fingerprint(ask.parameters, job.fingerprint_exclude))
    return answer(done, job_id, ask)


def to_queued(run_id: str, seen_attempt: int, sent: str | None = None) -> Response:
    """303 to the run's page, which says it is queued until an attempt after ``seen_attempt`` starts;
    ``sent``: the fingerprint of the parameters this request sent, so the page can say when the
    run took another send's."""
    return redirect(url_for("admin.run_page", run_id=run_id, queued=seen_attempt, sent=sent), code=303)


@blueprint.post("/runs/<run_id>/retry", provide_automatic_options=False)
@requires(Role.OPERATE)
def retry_run(run_id: str) -> Response | tuple[str, int]:
    try:
        retry = retry_of(app_state(), run_id)
    except (NotFound, Declined) as refused:
        return refused_page(refused)
    job_id = retry.failed.job_id
    note_run(job_id=job_id, source=RunSource.API)
    try:
        form_fields(RETRY_FIELDS)
    except REFUSED as refused:
        return refused_page(refused)
    ask = ManualRunRequest(retry_token(run_id), dict(retry.failed.parameters or {}))
    return dispatch_manual_run(job_id, retry.job, ask)


@blueprint.get("/runs/<run_id>/retry", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_retry(run_id: str) -> str | tuple[str, int]:
    """Retry's confirmation: the job, what it calls, and that the failed run's parameters are reused."""
    try:
        record = retry_of(app_state(), run_id).failed
    except (NotFound, Declined) as refused:
        return refused_page(refused)
    return render_template(
        "admin/confirm.html",
        title=f"Retry this failed run of {record.job_id}?",
        job_id=record.job_id,
        calls=app_state().jobs[record.job_id].runner.calls(),
        facts=[f"A new run with the failed run's parameters: {json.dumps(record.parameters or {}, sort_keys=True)}"],
        action=url_for("dashboard_actions.retry_run", run_id=run_id),
        hidden={},
        parameters=None,
        force=None,
        button="Retry it",
        back=url_for("admin.run_page", run_id=run_id),
    )


STEP_FIELDS = frozenset({"decision", "attempt", "result", "checked"})


@blueprint.post("/runs/<run_id>/steps/<step>", provide_automatic_options=False)
@requires(Role.OPERATE)
def settle_run_step(run_id: str, step: str) -> Response | tuple[str, int]:
    """The run page's answer to a step that needs review: mark it done (with its result) or run it
    again; then the run is reopened at the attempt the page showed (service.steps).  The operator
    ticks that they checked the downstream: the decision is theirs, and it cannot be undone."""
    try:
        fields = form_fields(STEP_FIELDS)
        if fields.get("checked") != "yes":
            raise Invalid("tick the box that says you checked the downstream by the step's key")
        seen = SlotRunRequest.parse(fields.get("attempt", ""), None).seen_attempt
        review = StepReview(step, fields.get("decision", ""), seen, result_from_text(fields.get("result", "")))
        note_run(run_id=run_id)
        done = settle_step(app_state(), current_principal(), run_id, review, queue=True)
    except REFUSED as refused:
        return refused_page(refused)
    except DispatchError as exc:
        return problem_page(
            502, f"the decision is kept, but the task queue did not take the run ({exc}); send the form again"
        )
    if isinstance(done, Queued):
        return to_queued(done.run_id, done.seen_attempt)
    return slot_answer(done)


def form_fields(allowed: frozenset[str]) -> dict[str, str]:
    """The posted form's fields: urlencoded, each at most once, none unknown."""
    if request.mimetype != FORM_TYPE:
        raise FormProblem(415, f"the dashboard's forms are sent as {FORM_TYPE}")
    form = request.form
    unknown = sorted(set(form) - allowed)
    if unknown:
        raise Invalid(f"unknown form field(s) {', '.join(unknown)}")
    repeated = sorted(name for name in form if len(form.getlist(name)) > 1)
    if repeated:
        raise Invalid(f"form field(s) sent more than once: {', '.join(repeated)}")
    return {name: form[name] for name in form}


def form_token(fields: dict[str, str]) -> str:
    token = fields.get("clientToken", "")
    problem = client_token_problem(token)
    if problem:
        raise Invalid(f"the form's {problem}; reload the page for a new form")
    return token


def form_parameters(text: str) -> dict[str, Any]:
    """The text area's JSON object (empty: no parameters), as strict and as bounded as the API's."""
    if not text.strip():
        return {}
    try:
        parameters = strict_json(text, "the parameters text")
    except InvalidJson as exc:
        raise Invalid(exc.message) from None
    if not isinstance(parameters, dict):
        raise Invalid('the parameters must be a JSON object, such as {"until": "2026-12-01T00:00:00Z"}')
    try:
        return Fingerprint.of(lambda: parameters).parameters()
    except GuardRejected as exc:
        raise Invalid(exc.message) from None


def answer(outcome: RunOutcome, job_id: str, ask: ManualRunRequest) -> Response | tuple[str, int]:
    """303 to the run's page whenever there is a run to see; a page saying why otherwise."""
    note_outcome(outcome)
    status = page_status(outcome)  # the answers table's; the words are the page's
    resend = {"job_id": job_id, "token": ask.client_token, "parameters": json.dumps(ask.parameters)}
    match outcome:
        case Conflict():
            return problem_page(
                status,
                "this form was already sent with other parameters; reload the page to run again",
                run_id=outcome.run_id,
            )
        case JobMismatch():
            return problem_page(
                status,
                f"this form's client token already started a run of another job ({outcome.record.job_id}); "
                "reload the page to run again",
                run_id=outcome.run_id,
            )
        case Released():
            cause = outcome.error.get("message") or outcome.error.get("type") or "a retryable error"
            return problem_page(
                status,
                f"the run failed with a retryable error and was released ({cause}). "
                "Send the form again to retry it under the same client token.",
                resend=resend,
            )
        case Overlap():
            return problem_page(
                status,
                "the job forbids overlap and another execution of it is running; send the form again later",
                resend=resend,
            )
        case Contended():
            # Reloading the dashboard would make a new token, and perhaps a second run: resend this one.
            return problem_page(status, "the ledger was busy; send the form again (it is the same run)", resend=resend)
        case Replayed() | InProgress():
            # The form was sent before (back, then Run now again): its page says a new run needs a reload.
            said = "form_used" if isinstance(outcome, Replayed) else "form_running"
            return redirect(url_for("admin.run_page", run_id=outcome.run_id, answer=said), code=303)
        case Finished() | Stale() | Skipped():
            # Finished, stale, skipped: the run's page tells the rest.
            return to_run_page(outcome)
        case _ as unreachable:
            assert_never(unreachable)


# What an action's outcome is called on the run page it answers with (admin.ACTION_ANSWERS says it in words).
ANSWER_OF = {Finished: "ran", Released: "released", Stale: "taken_over", InProgress: "running", Replayed: "already"}


def to_run_page(outcome: Finished | Replayed | InProgress | Released | Skipped | Stale) -> Response:
    """303 to the run's page, saying what this request did: ran it (and how that ended), found it
    done or running, or found it skipped."""
    said = ANSWER_OF.get(type(outcome), "skipped")
    return redirect(url_for("admin.run_page", run_id=outcome.run_id, answer=said), code=303)


def problem_page(status: int, message: str, **context: Any) -> tuple[str, int]:
    return render_template("admin/problem.html", status=status, message=message, **context), status


def refused_page(refused: FormProblem | NotFound | Invalid | Declined, **context: Any) -> tuple[str, int]:
    """A refusal as a page: the answers table's status (a form not sent as one: its own), its words."""
    status = refused.status if isinstance(refused, FormProblem) else page_status(refused)
    return problem_page(status, refused.message, **context)


@blueprint.post("/jobs/<job_id>/executions/<schedule_time>/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def run_slot(job_id: str, schedule_time: str) -> Response | tuple[str, int]:
    """The dashboard's "run" on a missed, failed, released, skipped, unknown or stuck slot.

    No form token: the slot's own key makes a Scheduler retry the same run,
    and the attempt the form was rendered with (``attempt``) makes a double
    click, a refresh or a resent form one reopen.  An unknown or stuck slot's
    form asks for ``force``, a box the operator ticks.
    """
    try:
        found, ask = asked_slot(job_id, schedule_time, form_fields(SLOT_RUN_FIELDS))
    except REFUSED as refused:
        return refused_page(refused)
    note_run(job_id=job_id, source=RunSource.SCHEDULER, run_id=found.run_id)
    try:
        done = run_slot_later(app_state(), current_principal(), job_id, found, ask)
    except DispatchError as exc:
        return problem_page(502, f"the task queue did not take the run ({exc}); send the form again")
    if isinstance(done, Queued):
        return to_queued(done.run_id, done.seen_attempt)
    return slot_answer(done)  # refused, or answered by its record (done, running): nothing is queued


@blueprint.get("/jobs/<job_id>/executions/<schedule_time>/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_run_slot(job_id: str, schedule_time: str) -> str | tuple[str, int]:
    """A slot run's confirmation: the job, what it calls, the slot and the attempt it replaces."""
    try:
        fields = {name: request.args[name] for name in SLOT_RUN_FIELDS - {"force"} if name in request.args}
        found, ask = asked_slot(job_id, schedule_time, fields)
    except REFUSED as refused:
        return refused_page(refused)
    state = app_state()
    record = state.ledger.lookup(found.run_id)
    status = execution_status(found, record, state.clock.now())
    facts = [f"The slot of {found.job.name} at {format_utc(found.schedule_time)} ({status}), under its own key."]
    if ask.seen_attempt:
        facts.append(f"It replaces attempt {ask.seen_attempt}.")
    force = "its record has expired: it may have run; run anyway" if status in NEEDS_FORCE else None
    if status == ExecutionStatus.STUCK and record is not None:
        words = stuck_words(record)
        facts.append(words[0].upper() + words[1:] + ".")
        force = (
            f"I understand that attempt {record.attempt} may already have taken effect; "
            f"attempt {record.attempt + 1} passes the downstream key {record.run_id}"
        )
    return render_template(
        "admin/confirm.html",
        title=f"Run this slot of {job_id}?",
        job_id=job_id,
        calls=state.jobs[job_id].runner.calls(),
        facts=facts,
        action=url_for("dashboard_actions.run_slot", job_id=job_id, schedule_time=schedule_time),
        hidden={
            "scheduler_job": found.job.name,
            "project": found.job.project,
            "location": found.job.location,
            "attempt": str(ask.seen_attempt or 0),
        },
        parameters=None,
        force=force,
        button="Run this slot",
        back=url_for("admin.history", job_id=job_id),
    )


SLOT_RUN_FIELDS = frozenset({"scheduler_job", "project", "location", "attempt", "force"})


def asked_slot(job_id: str, schedule_time: str, fields: dict[str, str]) -> tuple[Slot, SlotRunRequest]:
    """The slot a slot run's form (or its confirmation's link) names, and what it asks; NotFound
    or Invalid (the service's refusals) if none."""
    try:
        instant = request_time("schedule_time", schedule_time)
        ask = SlotRunRequest.parse(fields.pop("attempt", None), fields.pop("force", None))
        found = slot_of(app_state(), job_id, instant, **fields)
    except BadTime as bad:
        raise Invalid(bad.message) from None
    return found, ask


def slot_answer(outcome: RunOutcome | Declined) -> Response | tuple[str, int]:
    """303 to the slot's run page when the slot's own run answered; a page saying why otherwise."""
    status = page_status(outcome)  # the answers table's; the words are the page's
    match outcome:
        case Declined():
            return problem_page(status, outcome.message + "; reload the page to see the slot as it is")
        case JobMismatch():
            return problem_page(
                status,
                f"this slot's key holds a run of another job ({outcome.record.job_id}): the slot's own job never "
                "ran. A Scheduler job id shared by two jobs without a scope sends them the same keys: scope the "
                "deliveries or rename one Scheduler job, then run the slot",
            )
        case Overlap():
            return problem_page(
                status, "the job forbids overlap and another execution of it is running; try again later"
            )
        case Contended():
            return problem_page(status, "the ledger was busy; send again (it is the same run)")
        case Conflict():
            return problem_page(status, "this slot's record was written with other parameters", run_id=outcome.run_id)
        case Finished() | Replayed() | InProgress() | Released() | Skipped() | Stale():
            # Finished, replayed, in progress, released, skipped, stale: the run's page tells the rest.
            return to_run_page(outcome)
        case _ as unreachable:
            assert_never(unreachable)


PAUSE_FIELDS = frozenset({"note", "project", "location"})
RESUME_FIELDS = frozenset({"catch_up", "project", "location"})


@blueprint.post("/scheduler-jobs/<name>/pause", provide_automatic_options=False)
@requires(Role.OPERATE)
def pause_scheduler_job(name: str) -> Response | tuple[str, int]:
    """The card's Pause: idempotent (pausing a paused job changes nothing), so no form token."""
    return _set_paused(name, PAUSE_FIELDS, pause=True)


@blueprint.post("/scheduler-jobs/<name>/resume", provide_automatic_options=False)
@requires(Role.OPERATE)
def resume_scheduler_job(name: str) -> Response | tuple[str, int]:
    """The card's Resume, with the catch-up chosen: idempotent, its tasks named by their runs."""
    return _set_paused(name, RESUME_FIELDS, pause=False)


@blueprint.get("/scheduler-jobs/<name>/pause", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_pause(name: str) -> str | tuple[str, int]:
    """Pause's confirmation: the Scheduler job, its job, and the note said with the pause."""
    return _confirm_paused(name, pause=True)


@blueprint.get("/scheduler-jobs/<name>/resume", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_resume(name: str) -> str | tuple[str, int]:
    """Resume's confirmation: the Scheduler job, its job, and the catch-up chosen."""
    return _confirm_paused(name, pause=False)


def _confirm_paused(name: str, pause: bool) -> str | tuple[str, int]:
    state = app_state()
    try:
        job = scheduler_job_named(
            state, name, request.args.get("project") or None, request.args.get("location") or None
        )
    except Invalid as invalid:
        return refused_page(invalid)
    scheduler_name = f"projects/{job.project}/locations/{job.location}/jobs/{job.name}"
    catch_up_choices = None
    if pause:
        facts = [
            f"Cloud Scheduler stops delivering {job.name}; its slots until the resume are paused, not missed, "
            "and its row shows no next run while it is paused."
        ]
    else:
        every, latest = catch_up_preview(state, job)
        runs = min(every, job.max_catchup_runs)  # the newest, as the catch-up takes them
        back_as = spelled(job.catchup_window)
        facts = [
            f"Cloud Scheduler delivers {job.name} again from its next slot.",
            f"The pause holds {every} slot{'' if every == 1 else 's'} that never ran within its catch-up window "
            f"({back_as} back): the catch-up runs all {runs}, the latest {latest}, or none, each under its own key.",
        ]
        if every > runs:
            facts.append(
                f"A catch-up runs at most {job.max_catchup_runs} (max_catchup_runs): all runs the newest "
                f"{runs}, and the older {every - runs} stay paused."
            )
        catch_up_choices = [
            ("none", "none"),
            ("latest", f"the latest slot ({latest} run{'' if latest == 1 else 's'})"),
            ("all", f"all its slots ({runs} run{'' if runs == 1 else 's'})"),
        ]
        if every > 1 and external_of(state, job.target) is None:  # its own handler cannot be given them
            catch_up_choices.append(
                ("compact", f"one run of the latest slot standing for all {every} (1 run, {every - 1} covered)")
            )
    action = "pause_scheduler_job" if pause else "resume_scheduler_job"
    return render_template(
        "admin/confirm.html",
        title=f"{'Pause' if pause else 'Resume'} {job.name}?",
        job_id=job.target,
        calls_said="its Scheduler job is",
        calls=f"{scheduler_name} ({job.schedule}, {job.time_zone})",
        facts=facts,
        queued=False,
        action=url_for(f"dashboard_actions.{action}", name=job.name),
        hidden={"project": job.project, "location": job.location},
        note=pause,
        catch_up=catch_up_choices,
        parameters=None,
        force=None,
        button=f"{'Pause' if pause else 'Resume'} {job.name}",
        back=url_for("admin.dashboard", job=job.target),
    )


def _set_paused(name: str, allowed: frozenset[str], pause: bool) -> Response | tuple[str, int]:
    try:
        fields = form_fields(allowed)
        mode = fields.get("catch_up", "none")
        if mode not in CATCH_UP:  # the form's own words for its field
            raise Invalid(f"catch up must be one of {', '.join(CATCH_UP)}")
    except REFUSED as refused:
        return refused_page(refused)
    where = {"project": fields.get("project") or None, "location": fields.get("location") or None}
    ask = ScheduleChangeRequest(name, **where, note=fields.get("note"), catch_up=mode)
    try:
        done = (pause_schedule if pause else resume_schedule)(app_state(), current_principal(), ask)
    except Invalid as invalid:
        return refused_page(invalid)
    if done.not_dispatched is not None:
        return problem_page(
            502, f"resumed, but the catch-up was not dispatched ({done.not_dispatched}); send the form again"
        )
    if done.change.scheduler_problem:
        return problem_page(502, f"recorded in the app; {done.change.scheduler_problem}. Send the form again")
    # The page it lands on says what this did (``said``), once, and shows the job's new state.
    caught = len(done.caught_up or [])
    covered = len(done.compacted.covered) if done.compacted else 0
    said = "paused" if pause else f"resumed-{caught}" + (f"-{covered}" if covered else "")
    return redirect(url_for("admin.dashboard", job=done.change.job.target, said=said, scheduler_job=name), code=303)


BULK_FIELDS = frozenset({"slots", "day", "hour", "since", "until", "from", "scheduler_job", "project", "location"})


@blueprint.get("/jobs/<job_id>/history/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def confirm_bulk_run(job_id: str) -> str | tuple[str, int]:
    """The bulk run's confirmation: the missed and failed slots of the range (a day, an hour, a
    window, one Scheduler job's), judged as the history counts them, oldest first and BULK_LIMIT at
    most, each to be run under its own key and the attempt it has now.  It says how many the range
    holds and, when it holds more, where this run stops."""
    state = app_state()
    shown = history_range(state, job_id)
    until = min(shown.until, shown.range_start + COUNTED_DAYS)
    judged = judged_slots(state, shown.scheduler_jobs, shown.range_start, until)
    found = sorted(
        (
            (slot, status, attempt)
            for one in judged
            for slot, status, attempt in zip(one.slots, one.statuses, one.attempts, strict=True)
            if status in BULK_STATUSES
        ),
        key=lambda item: item[0].schedule_time,
    )
    if not found:
        return problem_page(409, "no missed or failed slot is left in this range; reload its history")
    chosen = found[:BULK_LIMIT]
    lines = [
        " ".join(
            (format_utc(slot.schedule_time), slot.job.name, slot.job.project, slot.job.location, str(attempt or 0))
        )
        for slot, _, attempt in chosen
    ]
    runs = f"{len(chosen)} run{'' if len(chosen) == 1 else 's'}"
    many = f"{len(found)} missed or failed slot{'' if len(found) == 1 else 's'}"
    reach = "in this range" if until >= shown.until else f"in this range up to {format_utc(until)} (8 days)"
    facts = [f"{many} {reach}: this makes {runs}, each under its slot's own key."]
    uncounted = sum(1 for one in judged if not one.counted)
    if uncounted:
        facts.append(
            f"Left out: {uncounted} Scheduler job(s) of the range, which holds more slots than one page judges. "
            "Run them from a shorter range."
        )
    if len(found) > len(chosen):
        facts.append(
            f"It stops at {format_utc(chosen[-1][0].schedule_time)}, after the oldest {len(chosen)} (at most "
            f"{BULK_LIMIT} at once); the {len(found) - len(chosen)} after it are offered again once these are queued."
        )
    facts += [f"{format_utc(slot.schedule_time)} ({slot.job.name}): {status}" for slot, status, _ in chosen]
    return render_template(
        "admin/confirm.html",
        title=f"Run {len(chosen)} slot{'' if len(chosen) == 1 else 's'} of {job_id}?",
        job_id=job_id,
        calls=state.jobs[job_id].runner.calls(),
        facts=facts,
        action=url_for("dashboard_actions.bulk_run", job_id=job_id),
        # The page it came from (a day, an hour, a range or a window), to go back to and answer on.
        hidden={"slots": "\n".join(lines), **_as_fields(shown.link_fields(request.args.get("from")))},
        parameters=None,
        force=None,
        button=f"Make these {runs}",
        queued_said=f"They go through the task queue, each under its slot's key; the next page is this range's "
        f"history, saying how many of the {runs} were queued.",
        once_said=f"Sent twice (a double click, a resent form, a refresh), it is still {runs}: each slot runs once.",
        back=link("admin.history", {"job_id": job_id}, shown.link_fields(request.args.get("from"))),
    )


def _as_fields(where: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in where.items() if value is not None}


@blueprint.post("/jobs/<job_id>/history/run", provide_automatic_options=False)
@requires(Role.OPERATE)
def bulk_run(job_id: str) -> Response | tuple[str, int]:
    """Run each slot the confirmation listed (``slots``: one per line, "time scheduler_job project
    location attempt") as its own slot run would: refused or answered by its record, or queued.
    The form sent twice queues nothing twice: each task id is the slot's run id and attempt."""
    try:
        fields = form_fields(BULK_FIELDS)
        for name in ("since", "until", "from"):  # the page it goes back to, held as the page holds them
            if fields.get(name):
                request_time(name, fields[name])
        entries = [line.split(" ") for line in fields.get("slots", "").splitlines() if line]
        if not entries or len(entries) > BULK_LIMIT or any(len(entry) != 5 for entry in entries):
            raise Invalid(f"the form's slots must be 1 to {BULK_LIMIT} lines of 5 fields; reload its history")
        asked = [
            asked_slot(
                job_id, when, {"scheduler_job": name, "project": project, "location": location, "attempt": attempt}
            )
            for when, name, project, location, attempt in entries
        ]
    except REFUSED as refused:
        return refused_page(refused)
    except BadTime as bad:
        return refused_page(Invalid(bad.message))
    done = run_slots_later(app_state(), current_principal(), job_id, asked)
    if done.stopped is not None:
        return problem_page(
            502, f"the task queue stopped taking the runs ({done.stopped}) after {done.queued}; send the form again"
        )
    bulk = f"{done.queued}-{done.answered}-{done.refused}"
    shown: dict[str, Any] = {
        name: fields.get(name) or None
        for name in ("day", "hour", "since", "until", "from", "scheduler_job", "project", "location")
    }
    return redirect(link("admin.history", {"job_id": job_id}, {**shown, "bulk": bulk}), code=303)
