"""Ready-made ``python`` jobs that are useful on their own."""

from __future__ import annotations

import collections
import datetime

from jobs.base import RunContext
from models import RunRecord

# A digest is a summary, not an export: stop counting after this many records.
DIGEST_SCAN_LIMIT = 20000


def ledger_digest(context: RunContext) -> dict:
    """Count the runs of the 24 hours before the schedule time, by job and status.

    Scheduled daily, its stored results form a history of what ran, failed
    and was retried, kept as long as the job's retention_seconds.
    """
    until = context.schedule_time or datetime.datetime.now(datetime.timezone.utc)
    since = until - datetime.timedelta(days=1)
    query = RunRecord.query(RunRecord.created >= since, RunRecord.created < until)
    by_job: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    retried = scanned = 0
    now = datetime.datetime.now(datetime.timezone.utc)
    for record in query.iter(batch_size=500, limit=DIGEST_SCAN_LIMIT):
        if record.is_expired(now):  # as every read does: past expire_at is gone
            continue
        scanned += 1
        by_job[record.job_id][record.status] += 1
        retried += record.attempt > 1
    return {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "runs": scanned,
        "complete": scanned < DIGEST_SCAN_LIMIT,
        "runs_with_takeovers": retried,
        "by_job": {job: dict(counts) for job, counts in sorted(by_job.items())},
    }
