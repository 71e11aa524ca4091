"""When the app first knew each schedule of a Scheduler job (schedules/history.py).

Kept apart from the run records, as the audit's mark is: no claim ever reads it, so
nothing it holds can stop a delivery from running.
"""

from __future__ import annotations

from google.cloud import ndb


class ScheduleHistory(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """One Scheduler job's schedules, oldest first: ``[{"schedule", "time_zone", "since"}]``."""

    _use_cache = False
    _use_global_cache = False

    versions = ndb.JsonProperty(required=True)
    # scheduler.yaml's paused as last applied to the job's pauses (None: never said).
    file_paused = ndb.BooleanProperty(indexed=False)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupScheduleHistory"
