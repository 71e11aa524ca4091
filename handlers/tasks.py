"""``/tasks/cleanup`` (cron.yaml's fallback for deleting expired records) and ``/tasks/audit`` (missed executions)."""

from __future__ import annotations

import time

from flask import Blueprint, jsonify

from handlers.access import Role, requires
from handlers.cross_site import changes_state
from handlers.state import app_state
from schedules.audit import audit
from schedules.pauses import with_pauses

blueprint = Blueprint("tasks", __name__, url_prefix="/tasks")

# One request stays well inside the 10-minute automatic-scaling timeout; the
# next cron run carries on where this one stopped.
CLEANUP_BUDGET_SECONDS = 60
CLEANUP_BATCH = 100


@blueprint.route("/cleanup", methods=["GET", "POST"], provide_automatic_options=False)
@changes_state  # cron calls it with GET
@requires(Role.DELIVER)
def cleanup_expired_runs():
    ledger = app_state().ledger
    deadline = time.monotonic() + CLEANUP_BUDGET_SECONDS
    deleted = batches = 0
    cursor = None
    while time.monotonic() < deadline:
        count, cursor = ledger.delete_expired(CLEANUP_BATCH, cursor)
        deleted += count
        batches += 1
        if cursor is None:
            break
    return jsonify({"deleted": deleted, "batches": batches, "more": cursor is not None})


@blueprint.route("/audit", methods=["GET", "POST"], provide_automatic_options=False)
@changes_state  # cron calls it with GET
@requires(Role.DELIVER)
def audit_missed_executions():
    """cron.yaml's missed-execution alert: each slot that became missed since the last pass, logged once."""
    state = app_state()
    found = audit(state.ledger, tuple(with_pauses(state.schedules)))  # a paused slot is not missed
    return jsonify(
        {
            "missed": [slot.document() for slot in found.missed],
            "conflicts": [slot.document() for slot in found.conflicts],
            "unverified": found.unverified,
            "scheduler_jobs": len(state.schedules),
        }
    )
