"""``/api/v1/scheduler-jobs``: the declared Scheduler jobs, and pausing and resuming them.

Pausing is an operator's action, so a paused job's slots are ``paused``, never ``missed``
(schedules/pauses.py).  Each pause and resume is recorded by the app and done in Cloud
Scheduler too (service.pauses: pause_schedule, resume_schedule).
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, jsonify, request

from dedup.adapters.flask_json import InvalidJson, json_payload
from dedup.keys import format_utc
from handlers.access import Role, requires
from handlers.cross_site import json_body
from handlers.problems import problem
from handlers.run_documents import scheduler_job_document
from handlers.state import app_state, current_principal
from service.errors import Invalid
from service.pauses import ScheduleChanged, ScheduleChangeRequest, pause_schedule, resume_schedule

log = logging.getLogger(__name__)

blueprint = Blueprint("schedule_actions", __name__, url_prefix="/api/v1")


@blueprint.get("/scheduler-jobs", provide_automatic_options=False)
@requires(Role.VIEW)
def list_scheduler_jobs():
    """Every declared Scheduler job: its target, schedule, when its slots are expected from, its pause."""
    return jsonify({"scheduler_jobs": [scheduler_job_document(job) for job in app_state().with_pauses()]})


def _asked(name: str, field: str) -> ScheduleChangeRequest:
    """The request as the service takes it: the job named, and the body's one optional ``field``."""
    payload = json_payload()
    if payload is not None and (not isinstance(payload, dict) or set(payload) - {field}):
        said = 'at most a "note"' if field == "note" else 'at most "catch_up"'
        raise Invalid(f"the request body must be a JSON object with {said}")
    return ScheduleChangeRequest(name, request.args.get("project"), request.args.get("location"), **(payload or {}))


def _change(name: str, pause: bool):
    try:
        ask = _asked(name, "note" if pause else "catch_up")
    except InvalidJson as exc:
        raise Invalid(exc.message) from None  # a body the API cannot read: the answers table's 400
    state = app_state()
    if pause:
        return _answer(pause_schedule(state, current_principal(), ask), "paused")
    return _answer(resume_schedule(state, current_principal(), ask), "resumed")


NOT_COVERED_LISTED = 100  # the slots a compaction could not cover that its answer names, the oldest


def _answer(done: ScheduleChanged, action: str):
    change = done.change
    if done.not_dispatched is not None:
        return problem(502, "DispatchFailed", str(done.not_dispatched), **change.document())
    document: dict[str, Any] = change.document()
    if done.caught_up is not None:
        document["caught_up"] = [slot.document() for slot in done.caught_up]
    if done.left_by_cap is not None:
        document["left_by_cap"] = done.left_by_cap.document()
    if done.compacted is not None:
        covered = done.compacted.covered
        document["compacted"] = {
            "run_id": done.compacted.slot.run_id,
            "schedule_time": format_utc(done.compacted.slot.schedule_time),
            "covered": len(covered),
            "first": format_utc(covered[0].schedule_time) if covered else None,
            "last": format_utc(covered[-1].schedule_time) if covered else None,
            "not_covered": [format_utc(slot.schedule_time) for slot in done.compacted.not_covered[:NOT_COVERED_LISTED]],
        }
    log.info(
        "Scheduler job %s %s by %s%s",
        change.job.name,
        action if change.changed else f"was {action} already",
        current_principal().name,
        f": {change.scheduler_problem}" if change.scheduler_problem else "",
        extra={"scheduler_job": change.job.name, "outcome": action},
    )
    if change.scheduler_problem:
        return problem(502, "CloudSchedulerError", change.scheduler_problem, **document)
    return jsonify(document)


@blueprint.post("/scheduler-jobs/<name>/pause", provide_automatic_options=False)
@json_body
@requires(Role.OPERATE)
def pause_scheduler_job(name: str):
    """Pause the Scheduler job (body: optional ``{"note"}``): its slots from now are ``paused``."""
    return _change(name, pause=True)


@blueprint.post("/scheduler-jobs/<name>/resume", provide_automatic_options=False)
@json_body
@requires(Role.OPERATE)
def resume_scheduler_job(name: str):
    """Resume the Scheduler job (body: optional ``{"catch_up": "none" | "latest" | "all" | "compact"}``):
    its slots from now are expected again, and the pause's slots that never ran are dispatched as asked."""
    return _change(name, pause=False)
