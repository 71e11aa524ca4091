"""The per-job lock of a job that forbids overlap (jobs.yaml ``overlap: forbid``).

Held by one attempt of one run, leased like the run: claimed in the same
transaction as the run, renewed by the heartbeat, released when the run
finishes or is released, so a crashed attempt never holds it past its lease.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb


class JobLock(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    _use_cache = False
    _use_global_cache = False

    run_id = ndb.TextProperty(required=True)  # unindexed
    attempt_id = ndb.TextProperty(required=True)
    lease_expires = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupJobLock"

    def is_held(self, now: datetime.datetime) -> bool:
        return bool(self.lease_expires > now)
