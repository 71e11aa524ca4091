"""Which Scheduler jobs need attention, found by index: the home page's order without a row per job.

The home page shows a page of Scheduler jobs, those that need attention first.  Reading every
job's row to sort them would cost reads in proportion to the fleet; instead two keys-only
queries, sent together, name the jobs to put first:

- the audit marks whose ``attention_until`` is still ahead (the audit sets it as it judges a
  slot missed, failed, late, overdue or stuck, for the 24 hours a row counts it, and while a
  failure streak lasts);
- the pause records whose ``paused`` is set.

The order is the audit's as of its last pass (every 15 minutes) and the pauses'; a row shown
says its own attention from its own reads, so a run that failed since the last pass is counted
on its row at once, and sorts first after the next pass.
"""

from __future__ import annotations

import datetime

from models.audit import AuditMark
from models.schedule_pause import SchedulePauses


def needing_attention(now: datetime.datetime) -> set[str]:
    """The history ids (``schedules.config.history_id``) of the Scheduler jobs to show first."""
    marked = AuditMark.query(AuditMark.attention_until > now).fetch_async(keys_only=True)
    paused = SchedulePauses.query(SchedulePauses.paused == True).fetch_async(keys_only=True)  # noqa: E712  # an ndb filter, not a comparison
    return {key.id() for key in (*marked.result(), *paused.result())}
