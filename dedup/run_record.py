"""The dedup entity: one record per run, keyed by its run_id.

Only the ledger (``dedup.ledger``) writes these records, always inside a
transaction that checks the attempt fence first.
"""

from __future__ import annotations

import datetime
import enum
from typing import Any

from google.cloud import ndb

# A record's job id (a jobs.yaml job's, a library handler's, a guard's namespace): what readers are
# sent, what Datastore indexes, and what /jobs/<job_id> serves.
MAX_JOB_ID_CHARS = 100


class RunStatus(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    # A retryable failure, kept: it counts as absent for the next claim (the retry runs at
    # once), which continues its attempt numbers and history.
    RELEASED = "released"
    # A delivery later than its job's max_delay_seconds: answered 200, the job not run.
    SKIPPED = "skipped"


class RunSource(enum.StrEnum):
    """Who asked for a run."""

    SCHEDULER = "scheduler"  # a Cloud Scheduler delivery of a slot
    FORCE_RUN = "force_run"  # a Cloud Scheduler delivery of no slot: Force run (jobs.run), keyed apart
    API = "api"  # a manual run with a client token
    GUARD = "guard"  # an endpoint behind the idempotency guard


# The sources Cloud Scheduler delivers: a run of either is answered and shown as a delivery's.
DELIVERED_SOURCES = (RunSource.SCHEDULER, RunSource.FORCE_RUN)


class RunRecord(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """A run (a Scheduler delivery's, a manual run's or a guarded call's) and the state of its current attempt.

    ``attempt`` counts the attempts (takeovers raise it) and ``attempt_id`` is
    a random id unique to one attempt; an attempt may change the record only
    while the stored ``attempt_id`` is still its own.  ``expire_at`` is a
    timestamp so a Firestore TTL policy can delete the record.
    """

    # Never serve run records from NDB's caches: every read must be a
    # strongly consistent Datastore read, or two processes could disagree on
    # who owns a run.
    _use_cache = False
    _use_global_cache = False

    # A RunSource value for this app's own runs; any name a guard's user chooses (source=) otherwise.
    source = ndb.StringProperty(required=True)
    job_id = ndb.StringProperty(required=True)  # for "guard" records: the guard's namespace
    # Read with the record, never queried: unindexed, so a write stores no index entries for them
    # (a schedule time rises with every slot, a hotspot at a fleet's minute boundaries).  Only what
    # a query filters or sorts on is indexed (tests/test_indexed_properties.py).
    scheduler_job_name = ndb.TextProperty()
    schedule_time = ndb.DateTimeProperty(indexed=False, tzinfo=datetime.UTC)
    project = ndb.TextProperty()
    location = ndb.TextProperty()

    # Client-token runs ("api", "guard"): the caller's token, the scope it
    # belongs to, the parameters and their fingerprint (SHA-256 of canonical
    # JSON, minus the names the caller's configuration leaves out).  Stored under
    # its first name, idempotency_key, so records written before keep reading.
    client_token = ndb.TextProperty(name="idempotency_key")
    scope = ndb.TextProperty()
    parameters = ndb.JsonProperty(compressed=True)
    fingerprint = ndb.TextProperty()
    # Who asked (handlers.access.Principal.name): user:alice@example.com, appengine:cron, ...
    requested_by = ndb.TextProperty()

    status = ndb.StringProperty(required=True, choices=[s.value for s in RunStatus])
    attempt_id = ndb.TextProperty(required=True)  # unindexed
    attempt = ndb.IntegerProperty(required=True, indexed=False)
    lease_expires = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    # Indexed: the cleanup task finds expired records with a keys-only query
    # on it (the fallback where no TTL policy is set).
    expire_at = ndb.DateTimeProperty(required=True, tzinfo=datetime.UTC)
    created = ndb.DateTimeProperty(required=True, tzinfo=datetime.UTC)
    updated = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    started = ndb.DateTimeProperty(indexed=False, tzinfo=datetime.UTC)
    finished = ndb.DateTimeProperty(indexed=False, tzinfo=datetime.UTC)

    # The resource a job started downstream (a Workflows execution, a Cloud
    # Run or Cloud Build operation), recorded as soon as the API answers so a
    # takeover adopts it instead of starting another.
    downstream = ndb.TextProperty()

    # A compacted catch-up (schedules' ``compact``): a slot's skipped record names the run that
    # stands for it (``compacted_into``, the run id), and that run lists the slot times it covers.
    compacted_into = ndb.TextProperty()
    covers = ndb.JsonProperty(compressed=True)

    # A python job's steps (dedup.steps): {name: {state, semantic, attempt, started, finished,
    # result}}, each written fenced by the attempt that ran it; they expire with the run.
    steps = ndb.JsonProperty(compressed=True)

    # The last MAX_ATTEMPT_HISTORY attempts: {attempt, attempt_id, started,
    # finished, outcome, instance}, written by the transactions that already
    # claim and finish runs (no extra round trip).
    attempts = ndb.JsonProperty(compressed=True)

    # Results and errors are JSON documents of the job's choosing.  A result
    # of None, 0, {} or [] is a real result: "completed" is decided by
    # ``status``, never by the truthiness of ``result``.
    result = ndb.JsonProperty(compressed=True)
    error = ndb.JsonProperty(compressed=True)
    # The first characters of the result or error as compact JSON, written with
    # it: lists of runs show this and never decode (or send) whole results.
    preview = ndb.TextProperty()

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupRun"

    @property
    def run_id(self) -> str:
        run_id: str = self.key.flat()[-1]  # keyed by its run id; flat() is kept, id() copies the path
        return run_id

    def lease_is_live(self, now: datetime.datetime) -> bool:
        return bool(self.status == RunStatus.IN_PROGRESS and self.lease_expires > now)

    def is_expired(self, now: datetime.datetime) -> bool:
        """Past ``expire_at``: counts as absent even before TTL deletes it."""
        return bool(self.expire_at <= now)

    @property
    def kept(self) -> Any:
        """What a finished record keeps: its result when completed, else its error."""
        return self.result if self.status == RunStatus.COMPLETED else self.error
