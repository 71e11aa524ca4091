"""Which of one audit share's Scheduler jobs need attention, as its last pass judged them.

The home page puts the Scheduler jobs that need attention first.  Finding them by a query on
the audit marks costs a round trip per batch of keys (about 300 on the emulator): 17 calls when
5,000 jobs need attention.  Each audit share (service.audits) instead writes what it judged in
one entity, and a page reads the shares' entities in one lookup, whatever the fleet.

Kept apart from the run records, as the audit's marks are: nothing a claim reads.
"""

from __future__ import annotations

import datetime

from google.cloud import ndb


class AttentionShare(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """The attention of ``count`` Scheduler jobs from ``first`` (history ids, scheduler.yaml's
    order), as the audit pass that judged them wrote it; keyed by the share's ordinal."""

    _use_cache = False
    _use_global_cache = False

    # The share it describes: a page trusts it only while scheduler.yaml still splits the same way.
    first = ndb.TextProperty(required=True)
    count = ndb.IntegerProperty(required=True, indexed=False)
    # A digest of the share's history ids in order: a version serving another scheduler.yaml (a
    # traffic split) whose share has the same first job and size is told apart by it.
    members = ndb.TextProperty(required=True)
    # When the pass read the share's pauses: pause changes since are found by their changed_at.
    pauses_read_at = ndb.DateTimeProperty(required=True, indexed=False, tzinfo=datetime.UTC)
    # {history id: [attention_until (RFC 3339) or None, paused]}, only of the jobs with either:
    # 1,000 jobs of the longest names (about 600 bytes each) fit an entity's 1 MiB, and names
    # compress well.
    jobs = ndb.JsonProperty(compressed=True)

    @classmethod
    def _get_kind(cls) -> str:
        return "DedupAttentionShare"

    @staticmethod
    def key_for(ordinal: int) -> ndb.Key:
        """The entity of the ``ordinal``-th share (0: the first AUDIT_SHARE_SIZE jobs)."""
        return ndb.Key(AttentionShare, f"share-{ordinal}")
