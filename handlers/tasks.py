"""``/tasks/cleanup`` (cron.yaml's fallback for deleting expired records) and ``/tasks/audit`` (missed, stuck)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request

from dedup.adapters.flask_guard import GuardRejected
from dedup.adapters.flask_json import InvalidJson, json_payload
from dedup.app_engine_markers import from_task_queue
from handlers.access import Principal, Role, requires
from handlers.answers import task_answer
from handlers.client_tokens import BODY_KEYS, earlier_manual_run_request, read_manual_run_request
from handlers.cross_site import changes_state, json_body
from handlers.logs import note_run
from handlers.problems import problem
from handlers.request_times import BadTime, request_time
from handlers.state import app_state
from models import RunSource
from schedules.audit import ReportedSlot
from schedules.config import SchedulerJob
from service.audits import AUDIT_SHARE_SIZE, audit_jobs, audit_share, split_audit
from service.errors import Declined, Invalid, NotFound
from service.runs import manually_runnable, run_manually
from service.slots import SlotRunRequest, run_slot_now, slot_of

blueprint = Blueprint("tasks", __name__, url_prefix="/tasks")

# One request stays well inside the 10-minute automatic-scaling timeout (half of it); the next
# cron run carries on where this one stopped.
CLEANUP_BUDGET_SECONDS = 300


@blueprint.route("/cleanup", methods=["GET", "POST"], provide_automatic_options=False)
@changes_state  # cron calls it with GET
@requires(Role.DELIVER)
def cleanup_expired_runs():
    done = app_state().ledger.clean_up(CLEANUP_BUDGET_SECONDS)
    return jsonify({"deleted": done.deleted, "batches": done.batches, "more": done.more})


@blueprint.route("/audit", methods=["GET", "POST"], provide_automatic_options=False)
@changes_state  # cron calls it with GET
@requires(Role.DELIVER)
def audit_missed_executions():
    """cron.yaml's missed-execution alert: each slot that became missed since the last pass, logged once.

    A fleet larger than one request's share is split: the rest is dispatched in shares
    (``/tasks/audit-share``), each named in ``shares``."""
    state = app_state()
    mine, shares = split_audit(state, state.schedules)
    return jsonify(
        {
            **_audited(mine),
            "scheduler_jobs": len(state.schedules),
            "shares": [share.document() for share in shares],
        }
    )


@blueprint.post("/audit-share", provide_automatic_options=False)
@json_body
@requires(Role.DELIVER)
def audit_dispatched_share():
    """A share of an audit pass (service.audits.split_audit): ``count`` Scheduler jobs from ``first``.

    An exception is a 500, which Cloud Tasks retries; a share that names no declared job
    (the file changed since) is settled, as a retry cannot change it."""
    ask = task_body(
        lambda ask: (
            set(ask) == {"first", "count"}
            and isinstance(ask["first"], str)
            and type(ask["count"]) is int
            and 1 <= ask["count"] <= AUDIT_SHARE_SIZE
        ),
        f"first (a Scheduler job's key) and count (1 to {AUDIT_SHARE_SIZE})",
    )
    if isinstance(ask, Response):
        return ask
    jobs = audit_share(app_state().schedules, ask["first"], ask["count"])
    if jobs is None:
        return task_answer(NotFound(f"scheduler.yaml declares no Scheduler job {ask['first']!r}"))
    return jsonify({**_audited(jobs), "scheduler_jobs": len(jobs)})


def _audited(jobs: tuple[SchedulerJob, ...]) -> dict[str, Any]:
    """One audit of ``jobs``, as the answer reports it."""
    found = audit_jobs(app_state(), jobs)
    return {
        "missed": [slot.document() for slot in found.missed],
        "caught_up": [ReportedSlot(slot).document() for slot in found.caught_up],
        "breaches": found.breaches,
        "conflicts": [slot.document() for slot in found.conflicts],
        "stuck": [slot.document() for slot in found.stuck],
        "unverified": found.unverified,
    }


SLOT_RUN_FIELDS = {"job_id", "schedule_time", "scheduler_job", "project", "location", "attempt", "requested_by"}


@blueprint.post("/run-slot", provide_automatic_options=False)
@json_body
@requires(Role.DELIVER)
def run_dispatched_slot():
    """A dispatched run of a slot (service.slots.slot_run_work), under the slot's own key.

    Cloud Tasks retries any answer but 2xx, so a settled outcome (completed, failed, a
    duplicate, a refusal) is 200 with the answer inside, and only what a retry may cure
    (409 in progress, 500 released) is answered as itself.
    """
    ask = task_body(
        lambda ask: (
            set(ask) - {"force"} == SLOT_RUN_FIELDS
            and isinstance(ask["attempt"], int)
            and ask.get("force", True) is True
        ),  # present only as true (service.slots.slot_run_work)
        ", ".join(sorted(SLOT_RUN_FIELDS)),
        names_who_asked=True,
    )
    if isinstance(ask, Response):
        return ask
    state = app_state()
    try:
        instant = request_time("schedule_time", ask["schedule_time"])
        where = (str(ask["scheduler_job"]), str(ask["project"]), str(ask["location"]))
        slot = slot_of(state, str(ask["job_id"]), instant, *where)
    except BadTime as exc:
        return task_answer(Invalid(str(exc)))
    except (NotFound, Invalid) as refused:
        return task_answer(refused)
    # The run records who asked for the catch-up; the queue only carried it.
    asked_by = Principal.named(str(ask["requested_by"]))
    note_run(job_id=str(ask["job_id"]), source=RunSource.SCHEDULER, run_id=slot.run_id)
    return task_answer(
        run_slot_now(state, asked_by, str(ask["job_id"]), slot, SlotRunRequest(ask["attempt"], "force" in ask))
    )


# The run API's body, and what the API reads from its URL (the job) and its caller (who asked).
MANUAL_RUN_TASK_FIELDS = frozenset({"job_id", "requested_by"})
MANUAL_RUN_FIELDS = MANUAL_RUN_TASK_FIELDS | BODY_KEYS
# The body the version before named its token in (client_token).  A task queued by it may still be
# in the queue, retried, when this version is deployed: it runs, rather than fail until dropped.
EARLIER_MANUAL_RUN_FIELDS = MANUAL_RUN_TASK_FIELDS | {"client_token", "parameters"}


@blueprint.post("/manual-run", provide_automatic_options=False)
@json_body
@requires(Role.DELIVER)
def run_dispatched_manual_run():
    """A dispatched manual run (service.runs.manual_run_work): the dashboard's Run now and Retry,
    under the client token the form carried, for the operator who confirmed it.  Its body is the
    run API's, read by the API's parser (``read_manual_run_request``).

    Answered as ``/tasks/run-slot`` is: a settled outcome is 200 with the answer inside, and
    only what a retry may cure (409 in progress, 500 released) is answered as itself.
    """
    ask = task_body(
        lambda ask: (
            set(ask) in (MANUAL_RUN_FIELDS, EARLIER_MANUAL_RUN_FIELDS)
            and all(isinstance(ask[name], str) for name in ("job_id", "requested_by"))
            and isinstance(ask.get("clientToken", ask.get("client_token")), str)
            and isinstance(ask["parameters"], dict)
        ),
        ", ".join(sorted(MANUAL_RUN_FIELDS)),
        names_who_asked=True,
    )
    if isinstance(ask, Response):
        return ask
    state = app_state()
    try:  # as the API reads it: the job, the token's rule, the parameters' bound
        job = manually_runnable(state, ask["job_id"])
        manual_run = (
            read_manual_run_request(also=MANUAL_RUN_TASK_FIELDS)
            if "clientToken" in ask
            else earlier_manual_run_request(ask["client_token"], ask["parameters"])
        )
    except (GuardRejected, InvalidJson) as exc:
        return task_answer(Invalid(exc.message))
    except (NotFound, Declined) as refused:
        return task_answer(refused)
    note_run(job_id=ask["job_id"], source=RunSource.API)
    # The run records who confirmed it; the queue only carried it.
    asked_by = Principal.named(ask["requested_by"])
    return task_answer(run_manually(state, asked_by, ask["job_id"], job, manual_run))


def task_body(
    valid: Callable[[dict[str, Any]], bool], holds: str, names_who_asked: bool = False
) -> dict[str, Any] | Response:
    """A dispatched task's JSON object, or the 400 (403) that answers it.

    ``names_who_asked``: the body says whose run it is (``requested_by``), which only the
    app's own queue may say: such a task must carry the queue's marker, which App Engine
    strips from every request from outside but a signed-in admin's, and no signed-in user,
    so another deliverer (a Scheduler job's OIDC token aimed here, say) or a signed-in
    Viewer cannot start runs in an operator's name.
    """
    if names_who_asked and not from_task_queue(request.headers):
        return problem(
            403, "Forbidden", "this task names who asked for it: only the task queue sends it, with no one signed in"
        )
    try:
        ask = json_payload()
    except InvalidJson as exc:
        return problem(400, "InvalidParameterException", exc.message)
    if not isinstance(ask, dict) or not valid(ask):
        return problem(400, "InvalidParameterException", f"the body must hold {holds}")
    return ask
