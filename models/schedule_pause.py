"""The intervals a Scheduler job was paused (schedules/pauses.py).

Kept apart from the run records: no claim reads it, so a pause can never stop a
delivery from running.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb


class SchedulePauses(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """One Scheduler job's pause intervals, oldest first (``schedules.intervals.Pause.document``)."""

    _use_cache = False
    _use_global_cache = False

    pauses = ndb.JsonProperty(required=True)
    # Whether the last interval is still open: indexed, so the home page finds the paused jobs
    # (which sort first) by a keys-only query.  An entity written before it reads as not paused
    # there until its next pause or resume; its row still says paused.
    paused = ndb.BooleanProperty(default=False)
    # When an interval last began or ended: indexed, so a page finds the pauses changed since an
    # audit share's entity read them (models.attention_share) without a query of every pause.
    changed_at = ndb.DateTimeProperty(tzinfo=datetime.UTC)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupSchedulePauses"
