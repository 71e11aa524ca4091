"""How the run API and the dashboard present a run record."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from dedup.claims import json_preview
from dedup.keys import format_utc
from dedup.steps import review_step, step_rows
from dedup.stored_response import StoredResponse
from models import DELIVERED_SOURCES, RunRecord, RunStatus
from schedules.bound import BoundJob
from schedules.pauses import current
from schedules.tallies import SlotDeliveries
from service.runs import retry_refusal


def _time(value: datetime.datetime | None) -> str | None:
    return format_utc(value) if value else None


def run_summary(record: RunRecord, now: datetime.datetime) -> dict[str, Any]:
    """What a list shows of a run: everything but its parameters, result, error, kept
    response and attempt history, which only ``preview`` hints at.

    Its size is bounded whatever a caller stored (docs/limits.md), and it never
    decodes the stored documents (NDB decodes a property when it is read).
    """
    return {**_fields(record, now), "preview": _preview(record)}


def run_summaries(records: list[RunRecord], now: datetime.datetime) -> list[dict[str, Any]]:
    """Summaries of ``records``, emptying the list as it goes.

    An old record without a stored preview is decoded to make one; letting
    each record go once summarised keeps one decoded record in memory, not a page.
    """
    records.reverse()
    summaries = []
    while records:
        summaries.append(run_summary(records.pop(), now))
    return summaries


def _preview(record: RunRecord) -> str | None:
    if record.status == RunStatus.IN_PROGRESS:
        return None
    if record.preview is not None:
        return record.preview
    # Written before previews were stored: make one from the document.
    return json_preview(record.result if record.status == RunStatus.COMPLETED else record.error)


def run_document(record: RunRecord, now: datetime.datetime) -> dict[str, Any]:
    """The whole record: its fields, parameters, attempt history and stored document."""
    document = {
        **_fields(record, now),
        "parameters": record.parameters,
        "attempts": record.attempts or [],
        "steps": step_rows(record.steps, record.run_id),
        "needs_review": review_step(record),
    }
    if record.source not in DELIVERED_SOURCES and StoredResponse.is_document(record.kept):
        document["response"] = response_view(StoredResponse.from_document(record.kept))
    elif record.status == RunStatus.COMPLETED:
        document["result"] = record.result
    elif record.status in (RunStatus.FAILED, RunStatus.RELEASED):
        document["error"] = record.error
    elif record.status == RunStatus.SKIPPED:
        document["reason"] = (record.error or {}).get("message")
    return document


# What a duplicate delivery was told, by the status of its answer.
DUPLICATE_ANSWERS = {
    200: "200: found it done, ran nothing",
    409: "409: found it running, ran nothing (Cloud Scheduler retries it)",
}


def deliveries_of(document: Mapping[str, Any], duplicates: SlotDeliveries | None) -> list[dict[str, Any]]:
    """Every delivery a run received that the app kept, oldest first: each attempt (a delivery
    that ran it, or took it over) and each listed duplicate (one that found it and ran nothing).

    The attempt history keeps its newest MAX_ATTEMPT_HISTORY entries and a slot lists its first
    DELIVERIES_LISTED duplicates; the page says what is counted beyond those.
    """
    rows = [
        {
            "received": entry.get("started"),
            "instance": entry.get("instance"),
            "answer": f"ran attempt {entry.get('attempt')}: {entry.get('outcome') or 'running'}",
            "kind": "attempt",
        }
        for entry in document.get("attempts") or []
    ]
    for delivery in duplicates.listed if duplicates else ():
        rows.append(
            {
                "received": format_utc(delivery.received),
                "instance": delivery.instance,
                "answer": DUPLICATE_ANSWERS.get(delivery.status, f"{delivery.status}: ran nothing"),
                "kind": "duplicate",
            }
        )
    # format_utc's one spelling per instant sorts as the instants do.
    return sorted(rows, key=lambda row: str(row["received"] or ""))


def _fields(record: RunRecord, now: datetime.datetime) -> dict[str, Any]:
    """What summaries and whole records share; never the parameters or the stored document."""
    document: dict[str, Any] = {
        "run_id": record.run_id,
        "job_id": record.job_id,
        "source": record.source,
        "status": record.status,
        "attempt": record.attempt,
        "stuck": is_stuck(record, now),
        "scheduler_job_name": record.scheduler_job_name,
        "schedule_time": _time(record.schedule_time),
        "project": record.project or None,
        "location": record.location or None,
        "client_token": record.client_token if record.source not in DELIVERED_SOURCES else None,
        "requested_by": record.requested_by,
        "downstream": record.downstream,
        "created": _time(record.created),
        "started": _time(record.started),
        "finished": _time(record.finished),
        "lease_expires": _time(record.lease_expires),
        "expire_at": _time(record.expire_at),
        "duration_seconds": duration_seconds(record),
        # The attempt history is small (at most MAX_ATTEMPT_HISTORY entries): summaries count it.
        "takeovers": sum(1 for entry in record.attempts or [] if entry.get("outcome") == "lease_expired"),
    }
    if record.compacted_into:
        document["compacted_into"] = record.compacted_into
    if record.covers:
        document["covers"] = list(record.covers)
    return document


def response_view(stored: StoredResponse) -> dict[str, Any]:
    """A kept HTTP response (manual runs, guarded calls): its status and its body, parsed when JSON.

    The body stays text unless it parses as strict JSON that is no longer
    re-encoded than as text: ``1E15`` would come back as ``1000000000000000.0``
    (a reader could be sent several times what was kept) and ``1E400`` as the
    non-JSON ``Infinity``.
    """
    body: Any = stored.body
    if not stored.binary and "json" in stored.headers.get("Content-Type", ""):
        try:
            parsed = json.loads(stored.body, parse_constant=_refuse_constant)
            if len(json.dumps(parsed, separators=(",", ":"), allow_nan=False)) <= len(json.dumps(stored.body)):
                body = parsed
        except (ValueError, RecursionError):
            pass
    return {"status": stored.status, "body": body, "binary": stored.binary}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def is_stuck(record: RunRecord, now: datetime.datetime) -> bool:
    """In progress with its lease over: the attempt is gone and nobody has taken over yet."""
    return record.status == RunStatus.IN_PROGRESS and record.lease_expires <= now


def duration_seconds(record: RunRecord) -> float | None:
    if record.finished and record.started:
        return round((record.finished - record.started).total_seconds(), 3)
    return None


def may_retry(record: RunRecord, jobs: Mapping[str, Any]) -> bool:
    """A failed manual run of a job still declared can be run again, with its parameters, under a new token."""
    return retry_refusal(record, jobs) is None  # the service's one rule (service.runs)


def scheduler_job_document(bound: BoundJob) -> dict[str, Any]:
    """A declared Scheduler job (bound to its pauses) as the API lists it and its job card shows it."""
    lasting, job, expected_from = current(bound.pauses), bound.declared, bound.expected_from
    return {
        "scheduler_job": job.name,
        "project": job.project,
        "location": job.location,
        "target": job.target,
        "schedule": job.schedule,
        "time_zone": job.time_zone,
        "expected_from": expected_from.isoformat().replace("+00:00", "Z") if expected_from else None,
        "paused": lasting is not None,
        "pause": lasting.document() if lasting else None,
    }
