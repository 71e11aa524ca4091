"""The one storage interface the protocol needs, apart from how any database does it.

``dedup.record_store.RecordStore`` is its Datastore implementation (the v1 API: the codec, the
calls, the fence check); ``dedup.transactions.transact`` is the one retry loop of any store's
transactions; ``dedup.memory_store.MemoryStore`` keeps records in
this process, for fast, deterministic tests of the decision layer.  Both are held to one
contract suite (tests/test_store_contract.py).  The ledger asks only this.

What a write's answer means (``Write``): ``Applied`` carries the new version; ``Exists`` (an
insert's key is taken), ``StaleVersion`` (a fenced write's version is old), ``Aborted`` and
``Refused`` (any other error) were not applied; ``Doubt`` may have been.  The ledger settles
every answer but ``Applied`` in a transaction that reads the record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from google.cloud import ndb

from dedup.fence_check import FenceCheck
from dedup.run_record import RunRecord


@dataclasses.dataclass(frozen=True)
class Applied:
    version: int


@dataclasses.dataclass(frozen=True)
class Exists:
    """An insert whose key was taken: not applied."""


@dataclasses.dataclass(frozen=True)
class StaleVersion:
    """A fenced update whose base version was not the entity's: not applied."""


@dataclasses.dataclass(frozen=True)
class Aborted:
    """Contention: Datastore says the commit was not applied."""


@dataclasses.dataclass(frozen=True)
class Refused:
    """Any other error: Datastore says the commit failed, so it was not applied.  The transaction
    that settles it reads the record all the same (safe whichever way the error is read)."""

    error: Exception


@dataclasses.dataclass(frozen=True)
class Doubt:
    """The answer was lost or late: the write may have landed."""

    error: Exception


type Write = Applied | Exists | StaleVersion | Aborted | Refused | Doubt


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A record as stored, with the version its last write gave it."""

    record: RunRecord
    version: int


class Transaction(Protocol):
    """One read-write transaction: reads, then writes kept until ``commit``, all or none."""

    began: bytes | None  # its id, kept after it ended (the next try's ``previous``)
    versions: dict[ndb.Key, int]  # after the commit: what each put's write gave it

    def get(self, keys: list[ndb.Key]) -> list[Versioned | None]: ...

    def put(self, entity: Any) -> None: ...

    def delete(self, key: ndb.Key) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class Store(Protocol):
    """Lookups with versions, inserts if absent, writes fenced on a version, and transactions."""

    @property
    def fence(self) -> FenceCheck:
        """Whether this store's writes fenced on a version are refused when stale, and why."""
        ...

    @property
    def fenced(self) -> bool: ...

    @property
    def database(self) -> str: ...

    def lookup(self, run_id: str) -> Versioned | None: ...

    def lookup_many(self, keys: list[ndb.Key]) -> list[Versioned | None]:
        """Strongly consistent reads of ``keys``, of any model (a run record, a job's lock, the
        schedules' entities), in order, None where absent; one round trip per Datastore batch."""
        ...

    def lookup_and_insert(self, record: RunRecord, entity: Any = None) -> tuple[Versioned | None, Write]: ...

    def insert(self, record: Any) -> Write: ...

    def update(self, record: Any, base_version: int, delete: tuple[ndb.Key, int] | None = None) -> Write: ...

    def delete_if(self, key: ndb.Key, version: int | None) -> Write: ...

    def delete_unchanged(self, doomed: list[Versioned]) -> int: ...

    def transaction(self, previous: bytes | None = None, begin_in_read: bool | None = None) -> Transaction:
        """A new transaction, of any models' entities: ``dedup.transactions.transact`` runs a body in
        one, and in another when it is tried again (the one retry loop)."""
        ...
