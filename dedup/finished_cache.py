"""Completed runs this process has seen, answered again without a Datastore round trip.

A completed run never changes (no claim replaces it; an operator's reopen
leaves completed runs alone), so a duplicate of one can be answered from
memory until the record's ``expire_at``.  Only completed records are kept:
an in-progress, released or skipped record is still to change, and a failed
one can be reopened by an operator (another process's cache would go on
answering the old failure).  Bounded in entries and in bytes (``max_bytes``,
``DEDUP_FINISHED_CACHE_MIB``), least recently used first out.
"""

from __future__ import annotations

import collections
import datetime
import json
import pickle
import threading

from dedup.run_record import RunRecord, RunStatus

MAX_ENTRIES = 1024
# What the entries may hold together, pickled: the cache's bound in memory, whatever the entry count
# (100,000 entries of the largest size would be 3.1 GiB, on an F2's 768 MB).
MAX_BYTES = 32 * 1024 * 1024
# A record whose result (a guarded call's kept response is its result) and parameters are larger
# together, as JSON, stays out, whatever jobs return and callers send (results may be 512 KiB,
# parameters 256 KiB): checked first, since it stops encoding at the limit.
MAX_DOCUMENT_CHARS = 16 * 1024
# And the whole record, pickled, at most this: 1,024 entries hold at most 32 MiB.
MAX_ENTRY_BYTES = 32 * 1024


class FinishedRuns:
    """Entries are kept pickled: what the cache holds is bounded in bytes (a decoded
    document is many times its JSON's size), and each answer is a fresh copy."""

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        max_document_chars: int = MAX_DOCUMENT_CHARS,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("the cache cannot hold fewer than no entries, nor less than no bytes")
        self.max_entries, self.max_document_chars, self.max_entry_bytes, self.max_bytes = (
            max_entries,
            max_document_chars,
            max_entry_bytes,
            max_bytes,
        )
        # run_id -> (expire_at, the pickled record)
        self._entries: collections.OrderedDict[str, tuple[datetime.datetime, bytes]] = collections.OrderedDict()
        self._held = 0  # the pickled bytes of the entries
        self._lock = threading.Lock()

    def get(self, run_id: str, now: datetime.datetime) -> RunRecord | None:
        """A copy of the completed record of ``run_id`` if this process holds one that has not expired.

        A copy: each caller may change what it was given (a replayed result, say)
        without changing what the next duplicate is answered, as when every
        answer came from Datastore.
        """
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is None:
                return None
            expire_at, pickled = entry
            if now >= expire_at:
                del self._entries[run_id]
                self._held -= len(pickled)
                return None
            self._entries.move_to_end(run_id)
        record: RunRecord = pickle.loads(pickled)  # iterative: no depth it was pickled at can fail here
        return record

    def remember(self, record: RunRecord) -> None:
        """Keep a copy of ``record`` if it is completed and small enough; anything else is never held."""
        if record.status != RunStatus.COMPLETED or self.max_entries == 0 or not self._small(record):
            return
        try:
            pickled = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except (RecursionError, pickle.PicklingError, TypeError):
            return  # nested deeper than pickle goes, or not picklable: never held
        if len(pickled) > min(self.max_entry_bytes, self.max_bytes):
            return
        with self._lock:
            replaced = self._entries.get(record.run_id)
            if replaced is not None:
                self._held -= len(replaced[1])
            self._entries[record.run_id] = (record.expire_at, pickled)
            self._held += len(pickled)
            self._entries.move_to_end(record.run_id)
            while len(self._entries) > self.max_entries or self._held > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._held -= len(evicted)

    def __len__(self) -> int:
        return len(self._entries)

    def held_bytes(self) -> int:
        """What the entries take, pickled: never more than max_bytes."""
        with self._lock:
            return self._held

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
