"""The read side the dashboard and the run API use, and the cleanup of expired records.

Apart from the fenced protocol (dedup/ledger.py): nothing here claims or
finishes a run, and every read leaves out records past ``expire_at``, as the
protocol's own reads do.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence

from google.cloud import ndb

from dedup.record_store import RecordStore
from dedup.run_record import RunRecord

# The longest string a filter may compare (Datastore's limit for indexed strings).
MAX_FILTER_BYTES = 1500
# How many batches one page of find_runs may read to skip expired records.
FIND_BATCHES = 5


@dataclasses.dataclass(frozen=True)
class RunFilter:
    """What the run API and the dashboard ask for; every field optional."""

    job_id: str | None = None
    status: str | None = None
    source: str | None = None
    since: datetime.datetime | None = None  # created at or after
    until: datetime.datetime | None = None  # created before

    def __post_init__(self) -> None:
        # Datastore refuses to compare an indexed string longer than this.
        for name in ("job_id", "status", "source"):
            value = getattr(self, name)
            if value is not None and len(value.encode("utf-8")) > MAX_FILTER_BYTES:
                raise ValueError(f"{name} filter is longer than {MAX_FILTER_BYTES} bytes")


def find_runs(
    run_filter: RunFilter, page_size: int, now: datetime.datetime, cursor: str | None = None
) -> tuple[list[RunRecord], str | None]:
    """Runs newest first, one page at a time (an NDB query cursor, URL-safe).

    Expired records are left out, as every read leaves them out.  The
    composite indexes these queries use are in index.yaml.
    """
    query = _query(run_filter)
    start = ndb.Cursor(urlsafe=cursor) if cursor else None
    visible: list[RunRecord] = []
    # Expired records (not yet deleted) are skipped; fetch on until the page is full.
    for _ in range(FIND_BATCHES):
        records, start, more = query.fetch_page(page_size - len(visible), start_cursor=start)
        visible += [record for record in records if not record.is_expired(now)]
        more = more and start is not None and bool(records)
        if len(visible) >= page_size or not more:
            break
    return visible, (start.urlsafe().decode("ascii") if more and start is not None else None)


def find_runs_together(
    run_filters: Sequence[RunFilter], page_size: int, now: datetime.datetime
) -> list[list[RunRecord]]:
    """The first page of each filter's runs, newest first, the queries sent at once: a view that
    lists many jobs' runs pays one round trip for all of them, not one per job.  A page that
    expired records left short is filled as find_runs fills it (rare: the cleanup runs hourly)."""
    sent = [(run_filter, _query(run_filter).fetch_page_async(page_size)) for run_filter in run_filters]
    pages = []
    for run_filter, answer in sent:
        records, cursor, more = answer.result()
        visible = [record for record in records if not record.is_expired(now)]
        if len(visible) < len(records) and more and cursor is not None:  # expired ones left it short
            rest, _ = find_runs(run_filter, page_size - len(visible), now, cursor.urlsafe().decode("ascii"))
            visible += rest
        pages.append(visible)
    return pages


def _query(run_filter: RunFilter) -> ndb.Query:
    """The runs ``run_filter`` names, newest first."""
    query = RunRecord.query()
    if run_filter.job_id:
        query = query.filter(RunRecord.job_id == run_filter.job_id)
    if run_filter.status:
        query = query.filter(RunRecord.status == run_filter.status)
    if run_filter.source:
        query = query.filter(RunRecord.source == run_filter.source)
    if run_filter.since:
        query = query.filter(RunRecord.created >= run_filter.since)
    if run_filter.until:
        query = query.filter(RunRecord.created < run_filter.until)
    return query.order(-RunRecord.created)


def run_ids_starting(prefix: str, limit: int) -> list[str]:
    """The ids of the records whose run id starts with ``prefix`` (lowercase hex), ``limit`` at most:
    a keys-only query of the key range, expired records included (a lookup leaves them out).
    What a person searches for with the 12 characters a page shows of an id."""
    low, high = ndb.Key(RunRecord, prefix), ndb.Key(RunRecord, prefix + "g")  # "g": past every hex digit
    keys = RunRecord.query(RunRecord.key >= low, RunRecord.key < high).fetch(limit, keys_only=True)
    return [str(key.id()) for key in keys]


def expired_keys(
    now: datetime.datetime, batch_size: int, cursor: str | None = None
) -> tuple[list[ndb.Key], str | None]:
    """One batch of the keys of records past ``expire_at`` (a keys-only query: one read per batch),
    and the cursor of the next batch, None after the last."""
    start = ndb.Cursor(urlsafe=cursor) if cursor else None
    keys, next_cursor, more = RunRecord.query(RunRecord.expire_at <= now).fetch_page(
        batch_size, keys_only=True, start_cursor=start
    )
    more = bool(keys) and more and next_cursor is not None and len(keys) == batch_size
    return keys, (next_cursor.urlsafe().decode("ascii") if more else None)


def delete_expired_keys(store: RecordStore, keys: list[ndb.Key], clock_now: Callable[[], datetime.datetime]) -> int:
    """Delete those of ``keys`` still expired at ``now`` and under no live lease, each only if
    unchanged since it was read: two cleanups at once, or a claim racing one, never lose a live
    record.  Where the version fence is verified, two round trips and no transaction (so it never
    contends with a claim); elsewhere small transactions (RecordStore.delete_unchanged).  How many went."""
    found = store.lookup_many(keys)
    now = clock_now()
    doomed = [
        record
        for record in found
        if record is not None and record.record.is_expired(now) and not record.record.lease_is_live(now)
    ]
    return store.delete_unchanged(doomed)


def delete_expired(
    now: datetime.datetime, clock_now: Callable[[], datetime.datetime], batch_size: int = 100, cursor: str | None = None
) -> tuple[int, str | None]:
    """Delete one batch of records past ``expire_at``; return (deleted, cursor of the next batch).

    The fallback where no TTL policy is set.  The cursor moves past records that had to be
    kept, so they never stall the batches behind them.
    """
    keys, next_cursor = expired_keys(now, batch_size, cursor)
    if not keys:
        return 0, None
    return delete_expired_keys(RecordStore.of_context(), keys, clock_now), next_cursor


# A cleanup batch: as many deletes as one commit takes.  The batches' lookups and deletes run on
# CLEANUP_WORKERS threads while the query finds the next batch, at most twice that many waiting.
CLEANUP_BATCH = 500
CLEANUP_WORKERS = 4


@dataclasses.dataclass(frozen=True)
class Cleanup:
    deleted: int
    batches: int
    more: bool  # the budget ran out before the last batch: the next call carries on


def clean_up(
    clock_now: Callable[[], datetime.datetime],
    budget_seconds: float,
    batch_size: int = CLEANUP_BATCH,
    workers: int = CLEANUP_WORKERS,
) -> Cleanup:
    """Delete the expired records, batch after batch, until none is left or the budget is spent."""
    store = RecordStore.of_context()
    client = ndb.get_context().client  # each worker decodes records into NDB models: a context each

    def delete(keys: list[ndb.Key]) -> int:
        with client.context():
            return delete_expired_keys(store, keys, clock_now)

    deadline = time.monotonic() + budget_seconds
    now = clock_now()  # one query, paged by its cursor, so one instant for it
    cursor: str | None = None
    pending: list[concurrent.futures.Future[int]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cleanup") as pool:
        while True:
            keys, cursor = expired_keys(now, batch_size, cursor)
            if keys:
                pending.append(pool.submit(delete, keys))
            if cursor is None or time.monotonic() >= deadline:
                break
            in_flight = [future for future in pending if not future.done()]
            if len(in_flight) >= 2 * workers:
                concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
        deleted = sum(future.result() for future in pending)
    return Cleanup(deleted, len(pending), cursor is not None)
