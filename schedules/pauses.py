"""Pause and resume: the intervals a Scheduler job was paused, who paused it, and why.

Pausing is the first thing an operator does in an incident, and a paused Cloud Scheduler
job delivers nothing: without this, every slot of the pause would be ``missed`` and the
audit would page for each.  A slot inside a pause interval is ``paused`` instead.  A
delivery of such a slot (a tick racing the pause, a Force run) runs as usual and says so;
deliveries of slots before the pause are unaffected.

The intervals are the app's own record (``DedupSchedulePauses``, one entity per Scheduler
job, read and changed through the store, dedup/store.py; a delivery reads them through NDB,
whose batching sends that read with its other one); the Cloud Scheduler job is paused and
resumed beside it (schedules/scheduler_api.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from typing import Any

from google.cloud import ndb

from dedup.record_store import RecordStore
from dedup.store import Store, Transaction
from dedup.transactions import get_many, transact
from models.schedule_pause import SchedulePauses
from schedules.config import SchedulerJob, history_id
from schedules.intervals import Pause as Pause  # its home is below config.py; read here with the pauses

MAX_NOTE_CHARACTERS = 500
MAX_PAUSES_KEPT = 200  # the newest intervals of a job; older ones are before any retention
PAUSE_PATIENCE_SECONDS = 10
FILE_PRINCIPAL = "scheduler.yaml"  # who paused a job the file says is paused


class PauseRefused(ValueError):
    """A pause or resume that cannot be done as asked (a note that cannot be kept)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def check_note(note: Any) -> str | None:
    if note is None or note == "":
        return None
    if not isinstance(note, str):
        raise PauseRefused("InvalidParameterException", "note must be a string")
    if len(note) > MAX_NOTE_CHARACTERS:
        raise PauseRefused("InvalidParameterException", f"note is longer than {MAX_NOTE_CHARACTERS} characters")
    if any(ord(ch) < 0x20 and ch not in "\t" for ch in note) or "\x7f" in note:
        raise PauseRefused("InvalidParameterException", "note contains control characters")
    return note


def current(pauses: Sequence[Pause]) -> Pause | None:
    """The pause that lasts, if the job is paused."""
    return pauses[-1] if pauses and pauses[-1].until is None else None


def pause_at(pauses: Sequence[Pause], instant: datetime.datetime) -> Pause | None:
    """The pause interval ``instant`` lies in, if any."""
    for interval in pauses:
        if interval.covers(instant):
            return interval
    return None


def paused(pauses: Sequence[Pause], now: datetime.datetime, by: str, note: str | None) -> list[Pause]:
    """The intervals with a pause from ``now``; unchanged if the job is paused already.

    Pausing twice is one pause, so a request sent again after a lost answer changes nothing."""
    if current(pauses) is not None:
        return list(pauses)
    return [*pauses, Pause(now, by, note)][-MAX_PAUSES_KEPT:]


def resumed(pauses: Sequence[Pause], now: datetime.datetime, by: str) -> list[Pause]:
    """The intervals with the lasting pause ended at ``now``; unchanged if the job is not paused."""
    lasting = current(pauses)
    if lasting is None:
        return list(pauses)
    return [*pauses[:-1], dataclasses.replace(lasting, until=max(now, lasting.since), resumed_by=by)]


def mark_counted(job: SchedulerJob, since: datetime.datetime, store: Store | None = None) -> bool:
    """Note that the ended pause from ``since`` has had its left slots counted: True for the one
    call that noted it (in a transaction, so two resumes, or a resume and the audit, count once)."""
    marked = False

    def change(pauses: list[Pause]) -> list[Pause]:
        nonlocal marked
        marked = False  # the transaction may run this again: only its committed run says
        updated = []
        for pause in pauses:
            if pause.since == since and pause.until is not None and not pause.counted:
                pause, marked = dataclasses.replace(pause, counted=True), True
            updated.append(pause)
        return updated

    change_pause(job, change, store)
    return marked


def _key(job: SchedulerJob) -> ndb.Key:
    return ndb.Key(SchedulePauses, history_id(job))


def _read(entity: Any) -> list[Pause]:
    return [Pause.from_document(d) for d in entity.pauses] if entity else []


def load_pauses(jobs: Sequence[SchedulerJob], store: Store | None = None) -> dict[str, list[Pause]]:
    """Every job's pause intervals, by history id: one batched lookup of ``store`` (default:
    Datastore's, in the current NDB context)."""
    if not jobs:
        return {}
    entities = get_many(store or RecordStore.of_context(), [_key(job) for job in jobs])
    return {history_id(job): _read(entity) for job, entity in zip(jobs, entities, strict=True)}


def pauses_of(job: SchedulerJob) -> list[Pause]:
    """One job's pause intervals: one lookup of the store (in the current NDB context)."""
    return load_pauses([job])[history_id(job)]


def pauses_read(job: SchedulerJob) -> Callable[[], list[Pause]]:
    """The read of one job's pause intervals sent now, and their intervals when called: NDB
    sends it in one lookup with the other reads sent before either is waited for."""
    future = _key(job).get_async()
    return lambda: _read(future.result())


def change_pause(
    job: SchedulerJob, change: Callable[[list[Pause]], list[Pause]], store: Store | None = None
) -> list[Pause]:
    """Apply ``change(pauses) -> pauses`` to the job's intervals in one transaction of ``store``
    (default: Datastore's, in the current NDB context), tried again as every transaction is."""
    key = _key(job)

    def apply(transaction: Transaction) -> list[Pause]:
        (found,) = transaction.get([key])
        updated = change(_read(found.record if found else None))
        changed_at = max((when for p in updated for when in (p.since, p.until) if when is not None), default=None)
        transaction.put(
            SchedulePauses(
                key=key,
                pauses=[p.stored() for p in updated],
                paused=current(updated) is not None,
                changed_at=changed_at,
            )
        )
        return updated

    updated, _ = transact(apply, PAUSE_PATIENCE_SECONDS, store or RecordStore.of_context())
    return updated
