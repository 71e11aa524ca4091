"""Duplicate deliveries absorbed, per Scheduler job and hour: counted behind the answer.

A delivery that finds its slot's run done (or running) runs nothing; the page says how
many did, beside the executions that ran once.  The count is written after the duplicate's
answer has gone (the handler's ``call_on_close``), so it never delays or fails one.  What
that costs: a worker that dies between the answer and the write, or a bucket too contended
to update within its patience, loses that count.  The figure is a floor, and the page says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from google.cloud import ndb

from dedup.keys import format_utc, parse_rfc3339
from dedup.record_store import RecordStore
from dedup.store import Store, Transaction
from dedup.transactions import get_many, transact
from models.delivery_tally import TALLY_HOURS, DeliveryTally
from models.slot_day import SlotDay
from schedules.summaries import bucket_for, count_duplicate, day_of

log = logging.getLogger(__name__)
# How long a contended bucket is tried (by the one retry loop) before the count is let go: about
# what NDB's three retries of a transaction took, backing off from a second.
TALLY_PATIENCE_SECONDS = 5.0
# The duplicates of one slot listed one by one (when, where, what it was told); the rest are
# counted only.  A per-minute job's hour of 60 slots then stays well inside an entity's 1 MiB.
DELIVERIES_LISTED = 12


@dataclasses.dataclass(frozen=True)
class DuplicateDelivery:
    """One delivery that found its slot's run done or running, and ran nothing."""

    received: datetime.datetime
    instance: str
    status: int  # what it was answered: 200 (done) or 409 (running elsewhere)

    def stored(self) -> list[Any]:
        return [format_utc(self.received), self.instance, self.status]

    @classmethod
    def from_stored(cls, value: Any) -> DuplicateDelivery | None:
        """None for anything this code did not write, rather than a broken page."""
        try:
            received, instance, status = value
            return cls(parse_rfc3339(received, "received"), str(instance), int(status))
        except (TypeError, ValueError):  # InvalidRunRequest is a ValueError
            return None


@dataclasses.dataclass(frozen=True)
class SlotDeliveries:
    """The duplicates a slot absorbed: how many were counted, and the first few of them."""

    count: int
    listed: tuple[DuplicateDelivery, ...]

    @classmethod
    def from_stored(cls, value: Any) -> SlotDeliveries:
        if isinstance(value, int):  # the first form kept a bare count
            return cls(value, ())
        if not isinstance(value, dict):
            return cls(0, ())
        listed = (DuplicateDelivery.from_stored(item) for item in value.get("seen") or ())
        count = value.get("n")
        return cls(count if isinstance(count, int) else 0, tuple(item for item in listed if item is not None))

    def plus(self, delivery: DuplicateDelivery) -> dict[str, Any]:
        """The stored form with ``delivery`` counted (and listed while there is room)."""
        listed = [item.stored() for item in self.listed]
        if len(listed) < DELIVERIES_LISTED:
            listed.append(delivery.stored())
        return {"n": self.count + 1, "seen": listed}


def hour_of(instant: datetime.datetime) -> datetime.datetime:
    return instant.astimezone(datetime.UTC).replace(minute=0, second=0, microsecond=0)


def tally_duplicate(
    scheduler_job: str, schedule_time: datetime.datetime, delivery: DuplicateDelivery, store: Store | None = None
) -> None:
    """Count one duplicate ``delivery`` of ``scheduler_job``'s (history id) slot at ``schedule_time``,
    in a transaction of ``store`` (default: Datastore's, in the current NDB context)."""
    hour = hour_of(schedule_time)
    key = DeliveryTally.key_for(scheduler_job, hour)
    # The day's summary counts it too, by hour: a home row reads two of those, not 24 tallies.
    day = day_of(schedule_time)
    day_key = SlotDay.key_for(scheduler_job, day)

    def add(transaction: Transaction) -> None:
        found, found_day = transaction.get([key, day_key])
        summary = bucket_for(found_day.record if found_day else None, day_key, day)
        if summary is not None:
            count_duplicate(summary, schedule_time)
            transaction.put(summary)
        tally = found.record if found else None
        if tally is not None and tally.hour > hour:
            return  # the bucket has moved on to a newer hour: this slot is older than the ring holds
        if tally is None or tally.hour < hour:
            tally = DeliveryTally(key=key, hour=hour, duplicates=0, by_slot={})
        slot = format_utc(schedule_time)
        kept = SlotDeliveries.from_stored((tally.by_slot or {}).get(slot))
        tally.by_slot = {**(tally.by_slot or {}), slot: kept.plus(delivery)}
        tally.duplicates += 1
        transaction.put(tally)

    # A count cannot tell its own landed commit when it reads again: a try in doubt is not repeated,
    # so a delivery is counted at most once and the figure stays the floor the page calls it.
    transact(add, TALLY_PATIENCE_SECONDS, store or RecordStore.of_context(), settles_doubt=False)


def tally_after_answer(
    client: ndb.Client, scheduler_job: str, schedule_time: datetime.datetime, delivery: DuplicateDelivery
) -> None:
    """``tally_duplicate`` in a context of its own, for after the response: it never raises,
    since by then nobody is left to tell."""
    try:
        with client.context():
            tally_duplicate(scheduler_job, schedule_time, delivery)
    except Exception:
        log.warning(
            "a duplicate delivery of %s at %s went uncounted",
            scheduler_job,
            schedule_time.isoformat(),
            exc_info=True,
        )


def tally_keys(scheduler_job: str, hours: Iterable[datetime.datetime]) -> list[ndb.Key]:
    return [DeliveryTally.key_for(scheduler_job, hour) for hour in hours]


def duplicates_in(
    tallies: Mapping[ndb.Key, DeliveryTally | None], scheduler_job: str, hours: Iterable[datetime.datetime]
) -> int:
    """The duplicates counted for ``hours`` of ``scheduler_job``, from buckets already read."""
    total = 0
    for hour in hours:
        tally = tallies.get(DeliveryTally.key_for(scheduler_job, hour))
        if tally is not None and tally.hour == hour:
            total += tally.duplicates
    return total


def deliveries_of_slot(
    scheduler_job: str, schedule_time: datetime.datetime, now: datetime.datetime, store: Store | None = None
) -> SlotDeliveries | None:
    """The duplicate deliveries counted for one slot (one lookup), or None where its hour is older
    than the ring keeps."""
    hour = hour_of(schedule_time)
    if now - hour >= datetime.timedelta(hours=TALLY_HOURS - 1):
        return None
    (tally,) = get_many(store or RecordStore.of_context(), [DeliveryTally.key_for(scheduler_job, hour)])
    if tally is None or tally.hour != hour:
        return SlotDeliveries(0, ())  # nothing counted in its hour yet (the bucket still holds an older one)
    return SlotDeliveries.from_stored((tally.by_slot or {}).get(format_utc(schedule_time)))


def hours_between(first: datetime.datetime, last: datetime.datetime) -> list[datetime.datetime]:
    """Every hour from ``first``'s to ``last``'s, both in."""
    hours, hour = [], hour_of(first)
    while hour <= last:
        hours.append(hour)
        hour += datetime.timedelta(hours=1)
    return hours
