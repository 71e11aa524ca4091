"""Ready-made ``python`` jobs that are useful on their own."""

from __future__ import annotations

import collections
import datetime
from typing import Any

from dedup.errors import InvalidRunRequest, PermanentJobError
from dedup.keys import format_utc, parse_schedule_time
from jobs.base import RunContext
from models import RunRecord, RunStatus

# A digest is a summary, not an export: stop counting after this many records.
DIGEST_SCAN_LIMIT = 20000
DIGEST_WINDOW = datetime.timedelta(days=1)
# Manual runs may name the end of the window to digest another day.
DIGEST_PARAMETERS = frozenset({"until"})


def ledger_digest(context: RunContext) -> dict[str, Any]:
    """Count the runs created in the 24 hours before the schedule time, per job.

    Scheduled daily, its stored results form a history of what ran, failed,
    was taken over and is stuck, kept as long as the job's retention_seconds.
    A manual run digests the day before now, or before its ``until``
    parameter (RFC 3339).  Released runs (retryable failures) are not counted:
    a release deletes its record, so only the ``outcome=released`` log lines
    know them.
    """
    until = _digest_until(context)
    since = until - DIGEST_WINDOW
    now = context.now()
    query = RunRecord.query(RunRecord.created >= since, RunRecord.created < until)
    by_job: dict[str, JobDigest] = collections.defaultdict(JobDigest)
    read = 0
    # No batch_size: google-cloud-ndb refuses it; the iterator fetches batch by batch.
    for record in query.iter(limit=DIGEST_SCAN_LIMIT):
        read += 1
        if record.is_expired(now):  # as every read does: past expire_at is gone
            continue
        by_job[record.job_id].count(record, now)
    digests = {job: digest.document() for job, digest in sorted(by_job.items())}
    return {
        "since": format_utc(since),
        "until": format_utc(until),
        "runs": sum(d["runs"] for d in digests.values()),
        # False when the scan stopped at DIGEST_SCAN_LIMIT records: the counts are a lower bound.
        "complete": read < DIGEST_SCAN_LIMIT,
        "runs_with_takeovers": sum(d["runs_with_takeovers"] for d in digests.values()),
        "releases": sum(d["releases"] for d in digests.values()),
        "by_job": digests,
    }


class JobDigest:
    """What one job's runs of the day came to."""

    def __init__(self) -> None:
        self.by_status: collections.Counter[str] = collections.Counter()
        self.by_source: collections.Counter[str] = collections.Counter()
        self.runs = self.stuck = self.takeovers = self.runs_with_takeovers = self.releases = 0

    def count(self, record: RunRecord, now: datetime.datetime) -> None:
        self.runs += 1
        self.by_status[record.status] += 1
        self.by_source[record.source] += 1
        if record.status == RunStatus.IN_PROGRESS and record.lease_expires <= now:
            self.stuck += 1  # its attempt is gone and nobody has taken over yet
        outcomes = [entry.get("outcome") for entry in record.attempts or [] if isinstance(entry, dict)]
        taken_over = outcomes.count("lease_expired")
        self.takeovers += taken_over
        self.releases += outcomes.count(RunStatus.RELEASED)  # retryable failures, retried or not
        self.runs_with_takeovers += bool(taken_over) or (not outcomes and record.attempt > 1)

    def document(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "by_status": dict(sorted(self.by_status.items())),
            "by_source": dict(sorted(self.by_source.items())),
            "stuck": self.stuck,
            "takeovers": self.takeovers,
            "runs_with_takeovers": self.runs_with_takeovers,
            "releases": self.releases,
        }


def _digest_until(context: RunContext) -> datetime.datetime:
    """The end of the window: the schedule time, a manual run's ``until``, or now."""
    unknown = sorted(set(context.parameters) - DIGEST_PARAMETERS)
    if unknown:
        raise PermanentJobError(f"unknown parameter(s) {', '.join(unknown)}; ledger-digest takes: until")
    if "until" in context.parameters:
        value = context.parameters["until"]
        if not isinstance(value, str):
            raise PermanentJobError("until must be an RFC 3339 timestamp string")
        try:
            # The schedule-time range: every window inside it can be computed and spelled.
            return parse_schedule_time(value)
        except InvalidRunRequest as exc:
            raise PermanentJobError(exc.message.replace("X-CloudScheduler-ScheduleTime", "until")) from None
    return context.schedule_time or context.now()
