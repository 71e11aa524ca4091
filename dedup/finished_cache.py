"""Completed runs this process has seen, answered again without a Datastore round trip.

A completed run never changes (no claim replaces it; an operator's reopen
leaves completed runs alone), so a duplicate of one can be answered from
memory until the record's ``expire_at``.  Only completed records are kept:
an in-progress, released or skipped record is still to change, and a failed
one can be reopened by an operator (another process's cache would go on
answering the old failure).  Bounded in entries and in the size of what it
holds, least recently used first out.
"""

from __future__ import annotations

import collections
import copy
import datetime
import json
import threading

from models import RunRecord, RunStatus

MAX_ENTRIES = 1024
# A record whose result (a guarded call's kept response is its result) and parameters are larger
# together stays out: what the cache holds of any size is bounded by MAX_ENTRIES x this, whatever
# jobs return and callers send (results may be 512 KiB, parameters 256 KiB); the rest of a
# record is small and bounded (ten attempts of history, a 200-character preview).
MAX_DOCUMENT_CHARS = 16 * 1024


class FinishedRuns:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_document_chars: int = MAX_DOCUMENT_CHARS) -> None:
        if max_entries < 0:
            raise ValueError("the cache cannot hold fewer than no entries")
        self.max_entries, self.max_document_chars = max_entries, max_document_chars
        self._entries: collections.OrderedDict[str, RunRecord] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str, now: datetime.datetime) -> RunRecord | None:
        """A copy of the completed record of ``run_id`` if this process holds one that has not expired.

        A copy: each caller may change what it was given (a replayed result, say)
        without changing what the next duplicate is answered, as when every
        answer came from Datastore.
        """
        with self._lock:
            record = self._entries.get(run_id)
            if record is None:
                return None
            if record.is_expired(now):
                del self._entries[run_id]
                return None
            self._entries.move_to_end(run_id)
        return copy.deepcopy(record)

    def remember(self, record: RunRecord) -> None:
        """Keep a copy of ``record`` if it is completed and small enough; anything else is never held."""
        if record.status != RunStatus.COMPLETED or self.max_entries == 0 or not self._small(record):
            return
        try:
            record = copy.deepcopy(record)  # the caller goes on using its own
        except RecursionError:
            return  # nested deeper than a copy can go (parameters may be): never held
        with self._lock:
            self._entries[record.run_id] = record
            self._entries.move_to_end(record.run_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def _small(self, record: RunRecord) -> bool:
        """Whether what the record holds of any size (its result, its parameters: a guarded
        call's may be 256 KiB) fits the limit together, encoding no more of it than the
        limit: a large record is looked at again on each of its uncached replays."""
        size = 0
        encoder = json.JSONEncoder(default=str)
        try:
            for document in (record.result, record.parameters):
                if document is None:
                    continue
                for chunk in encoder.iterencode(document):
                    size += len(chunk)
                    if size > self.max_document_chars:
                        return False
        except (TypeError, ValueError, RecursionError):
            return False
        return True
