"""``/api/v1/scheduler-jobs``: the declared Scheduler jobs, and pausing and resuming them.

Pausing is an operator's action, so a paused job's slots are ``paused``, never ``missed``
(schedules/pauses.py).  Each pause and resume is recorded by the app and done in Cloud
Scheduler too (service.pauses.set_schedule_paused).
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, jsonify, request

from dispatch import DispatchError
from handlers.access import Role, requires
from handlers.cross_site import json_body
from handlers.problems import problem
from handlers.run_documents import scheduler_job_document
from handlers.state import app_state, current_principal
from handlers.strict_json import InvalidJson, json_payload
from schedules.pauses import PauseRefused, check_note, with_pauses
from service.pauses import (
    CATCH_UP,
    CaughtUp,
    PauseChange,
    catch_up,
    last_pause,
    scheduler_job_named,
    set_schedule_paused,
)

log = logging.getLogger(__name__)

blueprint = Blueprint("schedule_actions", __name__, url_prefix="/api/v1")
INVALID = "InvalidParameterException"


@blueprint.get("/scheduler-jobs", provide_automatic_options=False)
@requires(Role.VIEW)
def list_scheduler_jobs():
    """Every declared Scheduler job: its target, schedule, when its slots are expected from, its pause."""
    return jsonify({"scheduler_jobs": [scheduler_job_document(job) for job in with_pauses(app_state().schedules)]})


def _note() -> str | None:
    payload = json_payload()
    if payload is None:
        return None
    if not isinstance(payload, dict) or set(payload) - {"note"}:
        raise PauseRefused(INVALID, 'the request body must be a JSON object with at most a "note"')
    return check_note(payload.get("note"))


def _answer(change: PauseChange, action: str, caught_up: list[CaughtUp] | None = None):
    document: dict[str, Any] = change.document()
    if caught_up is not None:
        document["caught_up"] = [slot.document() for slot in caught_up]
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


def _catch_up_mode() -> str:
    payload = json_payload()
    if payload is None:
        return "none"
    if not isinstance(payload, dict) or set(payload) - {"catch_up"}:
        raise PauseRefused(INVALID, 'the request body must be a JSON object with at most "catch_up"')
    mode = payload.get("catch_up", "none")
    if mode not in CATCH_UP:
        raise PauseRefused(INVALID, f"catch_up must be one of {', '.join(CATCH_UP)}")
    return str(mode)


def _change(name: str, pause: bool):
    try:
        note = _note() if pause else None
        mode = "none" if pause else _catch_up_mode()
    except InvalidJson as exc:
        return problem(400, INVALID, exc.message)
    except PauseRefused as refused:
        return problem(400, refused.error, refused.message)
    state = app_state()
    job = scheduler_job_named(state, name, request.args.get("project"), request.args.get("location"))
    change = set_schedule_paused(state, current_principal(), job, pause, note)
    if pause:
        return _answer(change, "paused")
    # The pause just ended (or an earlier one, for a resume sent again): its slots, as asked.
    [bound] = with_pauses([job])
    interval = last_pause(bound)
    try:
        caught_up = catch_up(state, current_principal(), bound, interval, mode) if interval else []
    except DispatchError as exc:
        return problem(502, "DispatchFailed", str(exc), **change.document())
    return _answer(change, "resumed", caught_up)


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
    """Resume the Scheduler job (body: optional ``{"catch_up": "none" | "latest" | "all"}``): its slots
    from now are expected again, and the pause's slots that never ran are dispatched as asked."""
    return _change(name, pause=False)
