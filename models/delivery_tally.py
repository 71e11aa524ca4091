"""How many duplicate deliveries each Scheduler job's slots absorbed, by the slot's hour.

The proof a person asks of the page ("288 executions, 288 ran once, 9 duplicate deliveries
absorbed") needs the deliveries that ran nothing, which no run record keeps: a duplicate's
answer must not wait on a write.  So a duplicate is counted after its answer is sent
(``schedules.tallies``), here, apart from the run records: nothing a claim reads.

A ring of TALLY_HOURS buckets per Scheduler job, each holding the hour it counts: the
entities stay bounded without a cleanup, and a bucket whose hour is older than the one
asked for counts nothing.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb

# The hours a Scheduler job's ring holds: more than the day the home rows count, with a day to spare.
TALLY_HOURS = 48


class DeliveryTally(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """The duplicate deliveries of one Scheduler job's slots of one hour (UTC)."""

    _use_cache = False
    _use_global_cache = False

    hour = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    duplicates = ndb.IntegerProperty(indexed=False, default=0)
    # The same duplicates by slot, {schedule time (RFC 3339): {"n": count, "seen": [[received,
    # instance, status], ...]}} (schedules.tallies.SlotDeliveries; a bare count in the first form):
    # what a run's page lists of its slot.  An hour holds at most 60 slots (a per-minute job), each
    # listing at most DELIVERIES_LISTED, so the map stays far inside an entity's 1 MiB.
    by_slot = ndb.JsonProperty(indexed=False)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupDeliveryTally"

    @staticmethod
    def key_for(scheduler_job: str, hour: datetime.datetime) -> ndb.Key:
        """The bucket of ``hour`` in the ring of ``scheduler_job`` (its history id)."""
        index = int(hour.timestamp() // 3600) % TALLY_HOURS
        return ndb.Key(DeliveryTally, f"{scheduler_job}|{index:02d}")
