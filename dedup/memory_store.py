"""The storage interface (dedup/store.py) in this process's memory: for fast, deterministic tests.

It keeps what Datastore keeps, as Datastore would hand it back: each entity as the v1 API's
``Entity`` (``record_store.encode``: a record read is a copy, never the writer's object) and a
version that rises with every write.  It honours the contract the Datastore store is held to
(tests/test_store_contract.py): an insert of a taken key is ``Exists``; a write fenced on a
stale version is ``StaleVersion`` and changes nothing, each mutation on its own version; an
update of a missing entity is refused (NOT_FOUND) and nothing of its commit lands; a transaction
commits only if nothing it read was written since (else ABORTED, as contention is reported),
all or none.  It needs an NDB context only to build keys; it never calls out.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb
from google.cloud.datastore_v1.types import entity as entity_types

from dedup.fence_check import FenceCheck, FenceMode
from dedup.record_store import decode, encode
from dedup.run_record import RunRecord
from dedup.store import Applied, Exists, Refused, StaleVersion, Versioned, Write

FENCE = FenceCheck(FenceMode.VERSION, "in memory: a stale version is refused by construction")

type _Key = tuple[str, Any]  # (kind, name or id): one entity


def _key_of(key: ndb.Key) -> _Key:
    return (key.kind(), key.id())


class MemoryStore:
    """Records and versions in a dict, behind one lock; the Store protocol, nothing more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entities: dict[_Key, tuple[entity_types.Entity, int]] = {}
        self._versions = itertools.count(1)

    # -- the interface ---------------------------------------------------------

    @property
    def fence(self) -> FenceCheck:
        return FENCE

    @property
    def fenced(self) -> bool:
        return True

    @property
    def database(self) -> str:
        return ""

    def lookup(self, run_id: str) -> Versioned | None:
        return self.lookup_many([ndb.Key(RunRecord, run_id)])[0]

    def lookup_many(self, keys: list[ndb.Key]) -> list[Versioned | None]:
        with self._lock:
            return [self._read(key) for key in keys]

    def lookup_and_insert(
        self, record: RunRecord, entity: entity_types.Entity | None = None
    ) -> tuple[Versioned | None, Write]:
        with self._lock:
            found = self._read(record.key)
            return found, self._insert(entity if entity is not None else encode(record))

    def insert(self, record: Any) -> Write:
        with self._lock:
            return self._insert(_entity(record))

    def update(self, record: Any, base_version: int, delete: tuple[ndb.Key, int] | None = None) -> Write:
        entity = _entity(record)
        with self._lock:
            key = _key_of_entity(entity)
            if key not in self._entities:  # the whole commit fails: its delete does not land either
                return Refused(api_exceptions.NotFound("no entity to update"))  # type: ignore[no-untyped-call]
            if delete is not None:
                self._delete(_key_of(delete[0]), delete[1])
            if self._entities[key][1] != base_version:
                return StaleVersion()
            return Applied(self._write(key, entity))

    def delete_if(self, key: ndb.Key, version: int | None) -> Write:
        with self._lock:
            return self._delete(_key_of(key), version)

    def delete_unchanged(self, doomed: list[Versioned]) -> int:
        with self._lock:
            answers = [self._delete(_key_of(found.record.key), found.version) for found in doomed]
        return sum(isinstance(answer, Applied) for answer in answers)

    def transaction(self, previous: bytes | None = None, begin_in_read: bool | None = None) -> MemoryTransaction:
        return MemoryTransaction(self)

    # -- what tests set up ------------------------------------------------------

    def put(self, record: Any) -> int:
        """Write ``record`` whatever is stored (as an NDB ``put`` does): its new version."""
        entity = _entity(record)
        with self._lock:
            return self._write(_key_of_entity(entity), entity)

    def remove(self, key: ndb.Key) -> None:
        with self._lock:
            self._entities.pop(_key_of(key), None)

    # -- internals (the lock held) ---------------------------------------------

    def _read(self, key: ndb.Key) -> Versioned | None:
        stored = self._entities.get(_key_of(key))
        if stored is None:
            return None
        entity, version = stored
        return Versioned(decode(entity, ndb.Model._lookup_model(key.kind())), version)

    def _insert(self, entity: entity_types.Entity) -> Write:
        key = _key_of_entity(entity)
        if key in self._entities:
            return Exists()
        return Applied(self._write(key, entity))

    def _write(self, key: _Key, entity: entity_types.Entity) -> int:
        version = next(self._versions)
        self._entities[key] = (entity_types.Entity(entity), version)  # a copy: later edits stay the writer's
        return version

    def _delete(self, key: _Key, version: int | None) -> Write:
        stored = self._entities.get(key)
        if stored is not None and version is not None and stored[1] != version:
            return StaleVersion()
        self._entities.pop(key, None)
        return Applied(next(self._versions))

    def _version(self, key: _Key) -> int:
        stored = self._entities.get(key)
        return 0 if stored is None else stored[1]


class MemoryTransaction:
    """Reads note each entity's version; the commit lands only if none moved since, all or none."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.began: bytes | None = uuid.uuid4().bytes
        self.versions: dict[ndb.Key, int] = {}
        self._read: dict[_Key, int] = {}
        self._writes: list[tuple[ndb.Key, entity_types.Entity | None]] = []

    def get(self, keys: list[ndb.Key]) -> list[Versioned | None]:
        with self._store._lock:
            found = [self._store._read(key) for key in keys]
            for key in keys:
                self._read.setdefault(_key_of(key), self._store._version(_key_of(key)))
        return found

    def put(self, entity: Any) -> None:
        self._writes.append((entity.key, encode(entity)))

    def delete(self, key: ndb.Key) -> None:
        self._writes.append((key, None))

    def commit(self) -> None:
        store = self._store
        with store._lock:
            if any(store._version(key) != version for key, version in self._read.items()):
                raise api_exceptions.Aborted("an entity this transaction read was written since")  # type: ignore[no-untyped-call]
            for key, entity in self._writes:
                if entity is None:
                    store._entities.pop(_key_of(key), None)
                else:
                    self.versions[key] = store._write(_key_of(key), entity)
        self._writes.clear()

    def rollback(self) -> None:
        self._writes.clear()


def _entity(record: Any) -> entity_types.Entity:
    return record if isinstance(record, entity_types.Entity) else encode(record)


def _key_of_entity(entity: entity_types.Entity) -> _Key:
    element = entity.key.path[-1]
    return (element.kind, element.name or element.id)
