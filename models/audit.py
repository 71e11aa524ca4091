"""What the missed-execution audit remembers: how far it has looked, per Scheduler job.

Kept apart from the run records on purpose: nothing the audit stores is ever
read by a claim, so it can never stop a late legitimate delivery from running.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb


class AuditMark(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """Every slot of one Scheduler job whose retry window closed before ``checked_until`` was audited."""

    _use_cache = False
    _use_global_cache = False

    checked_until = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    # The pass that wrote the mark (a random id per pass): a pass whose commit answer was lost
    # knows the mark is its own by this, never by a checked_until another pass may share.
    pass_id = ndb.TextProperty()
    # The pass whose mark this one replaced: a pass whose commit answer was lost, and whose mark
    # another pass has already moved on from, still knows its commit landed.
    previous_pass_id = ndb.TextProperty()
    # Failed executions in a row up to checked_until (a completed one ends the streak).
    failure_streak = ndb.IntegerProperty(indexed=False, default=0)
    # {schedule time: RunDigest.stored()} of the judged slots that completed and whose note the day
    # summaries lack (lost after its answer), for the last day or so (schedules.summaries).
    repairs = ndb.JsonProperty(indexed=False)
    # Until when the job's home row needs attention, as the passes judged it: a slot judged
    # missed, failed, late, overdue or stuck is counted for 24 hours, and a failure streak for as
    # long as it lasts.  Indexed: the home page finds the jobs that sort first by a keys-only query
    # (handlers/attention.py), not by reading every job's row.
    attention_until = ndb.DateTimeProperty(tzinfo=datetime.UTC)
    # The part of attention_until the judged slots give (24 hours past the newest that needs
    # attention): kept apart, so a failure streak's share ends with the streak.
    slots_attention_until = ndb.DateTimeProperty(indexed=False, tzinfo=datetime.UTC)
    # The newest judged slot that made progress (ran, or was excluded or covered): what a pass's
    # ``dedup.slot.progress_age`` counts from (schedules.metrics), for jobs too slow for an absence.
    progress_at = ndb.DateTimeProperty(indexed=False, tzinfo=datetime.UTC)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupAuditMark"
