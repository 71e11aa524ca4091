"""Which Scheduler jobs need attention: the home page's order in one round trip, whatever the fleet.

The home page shows a page of Scheduler jobs, those that need attention first.  Reading every
job's row to sort them would cost reads in proportion to the fleet, and so would a query of the
audit marks (a round trip per batch of about 300 keys).  Instead each audit share writes what
its pass judged in one entity (models.attention_share), and a page sends together:

- one lookup of the shares' entities: the jobs each pass judged to need attention (a slot
  missed, failed, late, overdue or stuck, for the 24 hours a row counts it, or a failure
  streak), and the jobs paused when it read their pauses;
- one query of the pauses changed since (a pause or resume by an operator or the audit).

Where a share's entity is missing (a pass that failed or raced another deletes it), describes
other jobs (scheduler.yaml changed since, or another version serves another), or is older than
FRESH_SECONDS (the audit has stopped passing), the page asks the index instead: the marks whose
``attention_until`` is ahead and the pauses that are open, two keys-only queries.

The order is the audit's as of its last pass; a row shown says its own attention from its own
reads, so a run that failed since the last pass is counted on its row at once, and sorts first
after the next pass.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dedup.keys import format_utc, parse_rfc3339
from dedup.store import Store, Transaction
from dedup.transactions import get_many, transact
from models.attention_share import AttentionShare
from models.audit import AuditMark
from models.schedule_pause import SchedulePauses
from schedules.config import AUDIT_INTERVAL_SECONDS, SchedulerJob, history_id

# A share's entity older than this says the audit has missed two passes: the index is asked.
FRESH_SECONDS = 3 * AUDIT_INTERVAL_SECONDS
# A pause changed this long before a pass read it may still have been unseen by that read: its
# transaction retried for a while, or its instance's clock runs behind.
CHANGE_SKEW_SECONDS = 60
# The most pause changes a page reads since the shares were written; more (a fleet paused at
# once) and it asks the index of open pauses instead.
RECENT_CHANGES = 500
WRITE_PATIENCE_SECONDS = 10


@dataclasses.dataclass(frozen=True)
class Share:
    """``count`` Scheduler jobs from ``first`` (a history id), the ``ordinal``-th share of an audit
    pass; ``members``: a digest of all their history ids, in order (``members_of``)."""

    ordinal: int
    first: str
    count: int
    members: str


def members_of(history_ids: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(history_ids)).encode()).hexdigest()


def shares_of(jobs: Sequence[SchedulerJob], size: int) -> list[Share]:
    """The shares an audit pass splits ``jobs`` (scheduler.yaml's order) into, ``size`` jobs each."""
    ids = [history_id(job) for job in jobs]
    return [
        Share(ordinal, ids[start], len(ids[start : start + size]), members_of(ids[start : start + size]))
        for ordinal, start in enumerate(range(0, len(ids), size))
    ]


def note_share(
    store: Store,
    share: Share,
    attention: Mapping[str, datetime.datetime | None],
    paused: Iterable[str],
    pauses_read_at: datetime.datetime,
) -> None:
    """Write what one pass judged of ``share``: each job's attention_until (``attention``, by
    history id) and the jobs paused when it read their pauses (at ``pauses_read_at``)."""
    jobs: dict[str, list[Any]] = {
        job: [format_utc(until), False]
        for job, until in attention.items()
        if until is not None and until > pauses_read_at
    }
    for job in paused:
        jobs.setdefault(job, [None, False])[1] = True
    entity = AttentionShare(
        key=AttentionShare.key_for(share.ordinal),
        first=share.first,
        count=share.count,
        members=share.members,
        pauses_read_at=pauses_read_at,
        jobs=jobs,
    )

    def put(transaction: Transaction) -> None:
        (found,) = transaction.get([entity.key])
        newer = found is not None and _describes(found.record, share) and found.record.pauses_read_at > pauses_read_at
        if not newer:  # a slower pass (a retried task beside the first) never undoes a later one
            transaction.put(entity)

    transact(put, WRITE_PATIENCE_SECONDS, store)


def forget_share(store: Store, share: Share) -> None:
    """Delete ``share``'s entity: pages ask the index until a pass writes it whole again (a pass
    that failed, or raced another, knows too little to write it)."""

    def delete(transaction: Transaction) -> None:
        transaction.delete(AttentionShare.key_for(share.ordinal))

    transact(delete, WRITE_PATIENCE_SECONDS, store)


def _describes(entity: Any, share: Share) -> bool:
    return bool((entity.first, entity.count, entity.members) == (share.first, share.count, share.members))


def needing_attention(store: Store, shares: Sequence[Share], now: datetime.datetime) -> set[str]:
    """The history ids of the Scheduler jobs to show first: one round trip where every share's
    entity is current, else the index's two keys-only queries."""
    if not shares:
        return set()
    oldest = now - datetime.timedelta(seconds=FRESH_SECONDS)
    since = oldest - datetime.timedelta(seconds=CHANGE_SKEW_SECONDS)
    # Sent before the lookup, and answered while it is: one round trip for both.
    changes = SchedulePauses.query(SchedulePauses.changed_at > since).fetch_async(limit=RECENT_CHANGES + 1)
    entities = get_many(store, [AttentionShare.key_for(share.ordinal) for share in shares])
    changed = changes.result()
    current: list[Any] = [
        entity
        for entity, share in zip(entities, shares, strict=True)
        if entity is not None and _describes(entity, share) and entity.pauses_read_at >= oldest
    ]
    if len(changed) > RECENT_CHANGES or len(current) < len(shares):
        return _by_index(now)
    judged, paused = set(), set()
    for entity in current:
        for job, (until, was_paused) in entity.jobs.items():
            if until is not None and parse_rfc3339(until, "attention_until") > now:
                judged.add(job)
            if was_paused:
                paused.add(job)
    for pause in changed:  # perhaps newer than a share's read: as the pause now stands
        (paused.add if pause.paused else paused.discard)(pause.key.id())
    return judged | paused


def _by_index(now: datetime.datetime) -> set[str]:
    """The marks whose attention_until is ahead and the open pauses: keys-only, sent together,
    a round trip per batch of keys."""
    marked = AuditMark.query(AuditMark.attention_until > now).fetch_async(keys_only=True)
    paused = SchedulePauses.query(SchedulePauses.paused == True).fetch_async(keys_only=True)  # noqa: E712  # an ndb filter, not a comparison
    return {key.id() for key in (*marked.result(), *paused.result())}
