"""Duplicate deliveries absorbed, per Scheduler job and hour: counted behind the answer.

A delivery that finds its slot's run done (or running) runs nothing; the page says how
many did, beside the executions that ran once.  The count is written after the duplicate's
answer has gone (the handler's ``call_on_close``), so it never delays or fails one.  What
that costs: a worker that dies between the answer and the write, or a bucket too contended
to update in a few tries, loses that count.  The figure is a floor, and the page says so.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping

from google.cloud import ndb

from dedup.keys import format_utc
from models.delivery_tally import TALLY_HOURS, DeliveryTally

log = logging.getLogger(__name__)
TALLY_RETRIES = 3  # tries of a contended bucket before the count is let go


def hour_of(instant: datetime.datetime) -> datetime.datetime:
    return instant.astimezone(datetime.UTC).replace(minute=0, second=0, microsecond=0)


def tally_duplicate(scheduler_job: str, schedule_time: datetime.datetime) -> None:
    """Count one duplicate delivery of ``scheduler_job``'s (history id) slot at ``schedule_time``."""
    hour = hour_of(schedule_time)
    key = DeliveryTally.key_for(scheduler_job, hour)

    def add() -> None:
        tally = key.get()
        if tally is not None and tally.hour > hour:
            return  # the bucket has moved on to a newer hour: this slot is older than the ring holds
        if tally is None or tally.hour < hour:
            tally = DeliveryTally(key=key, hour=hour, duplicates=0, by_slot={})
        slot = format_utc(schedule_time)
        tally.by_slot = {**(tally.by_slot or {}), slot: (tally.by_slot or {}).get(slot, 0) + 1}
        tally.duplicates += 1
        tally.put()

    ndb.transaction(add, retries=TALLY_RETRIES)


def tally_after_answer(client: ndb.Client, scheduler_job: str, schedule_time: datetime.datetime) -> None:
    """``tally_duplicate`` in a context of its own, for after the response: it never raises,
    since by then nobody is left to tell."""
    try:
        with client.context():
            tally_duplicate(scheduler_job, schedule_time)
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


def duplicates_of_slot(scheduler_job: str, schedule_time: datetime.datetime, now: datetime.datetime) -> int | None:
    """The duplicate deliveries counted for one slot (one lookup), or None where its hour is older
    than the ring keeps."""
    hour = hour_of(schedule_time)
    if now - hour >= datetime.timedelta(hours=TALLY_HOURS - 1):
        return None
    tally = DeliveryTally.key_for(scheduler_job, hour).get()
    if tally is None or tally.hour != hour:
        return 0  # nothing counted in its hour yet (the bucket still holds an older one)
    return int((tally.by_slot or {}).get(format_utc(schedule_time), 0))


def hours_between(first: datetime.datetime, last: datetime.datetime) -> list[datetime.datetime]:
    """Every hour from ``first``'s to ``last``'s, both in."""
    hours, hour = [], hour_of(first)
    while hour <= last:
        hours.append(hour)
        hour += datetime.timedelta(hours=1)
    return hours
