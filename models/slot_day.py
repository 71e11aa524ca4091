"""What one Scheduler job's slots of one UTC day came to, kept as runs finish (schedules.summaries).

The home row of a Scheduler job reads two of these (its last 24 hours span two UTC days)
instead of a record per slot: a fleet's page then costs reads per row shown, not per slot.
Kept apart from the run records, as the tallies and the audit's marks are: nothing a claim
reads, so a summary can never stop or delay a delivery.

A ring of SUMMARY_DAYS buckets per Scheduler job, each holding the day it summarises: the
entities stay bounded without a cleanup, and a bucket whose day is older than the one asked
for summarises nothing.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb

# Today, yesterday (the row's 24 hours reach into it), and one to spare for a late note.
SUMMARY_DAYS = 3


class SlotDay(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """One Scheduler job's slots of one UTC day: each finished run's facts, and the duplicates by hour."""

    _use_cache = False
    _use_global_cache = False

    # The day's start (midnight UTC): a timestamp, as the store writes every instant.
    day_start = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    # {schedule time (RFC 3339): RunDigest.stored()}: what a finished run of the slot says of
    # itself, enough to give the slot's status as its record would.  A per-minute job's day of
    # 1,440 slots is about 90 KiB, far inside an entity's 1 MiB.
    runs = ndb.JsonProperty(indexed=False)
    # {schedule time: n}: the duplicate deliveries each of the day's slots absorbed (a floor, as
    # schedules.tallies counts them); a slot that absorbed none is not listed.
    duplicates = ndb.JsonProperty(indexed=False)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupSlotDay"

    @classmethod
    def fresh(cls, key: ndb.Key, day: datetime.date) -> SlotDay:
        """An empty bucket for ``day``."""
        start = datetime.datetime.combine(day, datetime.time(), datetime.UTC)
        return cls(key=key, day_start=start, runs={}, duplicates={})

    @property
    def day(self) -> datetime.date:
        start: datetime.datetime = self.day_start
        return start.date()

    @staticmethod
    def key_for(scheduler_job: str, day: datetime.date) -> ndb.Key:
        """The bucket of ``day`` in the ring of ``scheduler_job`` (its history id)."""
        return ndb.Key(SlotDay, f"{scheduler_job}|{day.toordinal() % SUMMARY_DAYS}")
