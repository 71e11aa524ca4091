"""The protocol's hot writes, on the Datastore v1 API that NDB itself sits on.

NDB can neither insert only if absent nor write only if the entity is still the version
last seen; Datastore's v1 API can, each in one round trip:
- an ``insert`` committed in a single-use transaction, refused with ALREADY_EXISTS when the
  key exists: a claim of a run nobody has recorded, with no read first;
- an ``update`` carrying ``base_version``, not applied (``conflict_detected``) when anyone
  wrote the entity since that version: a fence without a read.
So a fresh run costs its claim and its finish, and a renewal one round trip.  Everything
here goes through the gRPC transport the ``ndb.Client`` already holds (its channel, its
credentials), on google-cloud-datastore's public types; never NDB's private modules.

The record keeps one definition, ``models.RunRecord``: ``encode`` and ``decode`` map it to
the entity NDB itself writes and reads, property by property from the model's own
declarations (``tests/test_record_store.py`` holds the two encodings together), so the
queries, the dashboard and the audit go on reading through NDB.

What an answer means (``Write``): ``Applied`` carries the new version; ``Exists`` (an insert's
key is taken) and ``Conflict`` (a fenced update's version is old) and ``Aborted`` were not
applied; ``Doubt`` (DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL, UNKNOWN) may have been.  The
ledger answers each by reading the record: every write carries the attempt id that made it,
so a write in doubt is recognised as its own and never applied twice.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
from google.api_core import exceptions as api_exceptions
from google.api_core.gapic_v1 import routing_header
from google.cloud import ndb
from google.cloud.datastore_v1.types import datastore as datastore_types
from google.cloud.datastore_v1.types import entity as entity_types

from models import RunRecord

# Each hot write's own deadline.  A call that outlives it is a Doubt, which the ledger settles
# by reading the record in its transactional path (with that path's patience).
CALL_TIMEOUT_SECONDS = 10.0
# NDB marks a compressed blob with this meaning (google.appengine's ZLIB), and reads one by
# zlib's header either way.
COMPRESSED_MEANING = 22
_IN_DOUBT = (
    api_exceptions.DeadlineExceeded,
    api_exceptions.ServiceUnavailable,
    api_exceptions.InternalServerError,
    api_exceptions.Unknown,
)


@dataclasses.dataclass(frozen=True)
class Applied:
    version: int


@dataclasses.dataclass(frozen=True)
class Exists:
    """An insert whose key was taken: not applied."""


@dataclasses.dataclass(frozen=True)
class Conflict:
    """A fenced update whose base version was not the entity's: not applied."""


@dataclasses.dataclass(frozen=True)
class Aborted:
    """Contention: Datastore says the commit was not applied."""


@dataclasses.dataclass(frozen=True)
class Doubt:
    """The answer was lost or late: the write may have landed."""

    error: Exception


type Write = Applied | Exists | Conflict | Aborted | Doubt


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A record as stored, with the version its last write gave it."""

    record: RunRecord
    version: int


# -- the record's one definition, as the entity NDB writes -------------------------------


def _properties() -> Iterator[Any]:
    """RunRecord's declared properties (NDB's public ``_properties``: its names are the model's)."""
    return iter(RunRecord._properties.values())


def _value(prop: Any, value: Any) -> entity_types.Value:
    unindexed = not prop._indexed
    if value is None:
        return entity_types.Value(null_value=0, exclude_from_indexes=unindexed)
    if isinstance(prop, ndb.JsonProperty):
        blob = json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        if prop._compressed:
            return entity_types.Value(
                blob_value=zlib.compress(blob), meaning=COMPRESSED_MEANING, exclude_from_indexes=True
            )
        return entity_types.Value(blob_value=blob, exclude_from_indexes=True)
    if isinstance(prop, ndb.DateTimeProperty):
        return entity_types.Value(timestamp_value=value.astimezone(datetime.UTC), exclude_from_indexes=unindexed)
    if isinstance(prop, ndb.IntegerProperty):
        return entity_types.Value(integer_value=int(value), exclude_from_indexes=unindexed)
    if isinstance(prop, ndb.StringProperty | ndb.TextProperty):
        return entity_types.Value(string_value=str(value), exclude_from_indexes=unindexed)
    raise TypeError(f"RunRecord.{prop._code_name}: no encoding for {type(prop).__name__}")


def _decoded(prop: Any, value: entity_types.Value) -> Any:
    kind = entity_types.Value.pb(value).WhichOneof("value_type")
    if kind in (None, "null_value"):
        return None
    if isinstance(prop, ndb.JsonProperty):
        blob = value.blob_value if kind == "blob_value" else value.string_value.encode()
        if blob.startswith((b"x\x9c", b"x\x01", b"x\xda", b"x^")):  # zlib's headers, as NDB reads them
            blob = zlib.decompress(blob)
        return json.loads(blob)
    if kind == "timestamp_value":
        return datetime.datetime.fromtimestamp(value.timestamp_value.timestamp(), datetime.UTC).replace(
            microsecond=value.timestamp_value.microsecond
        )
    if kind == "integer_value":
        return value.integer_value
    if kind == "string_value":
        return value.string_value
    raise TypeError(f"RunRecord.{prop._code_name}: stored as {kind}")


def key_pb(key: ndb.Key) -> entity_types.Key:
    return entity_types.Key(
        partition_id=entity_types.PartitionId(
            project_id=key.project(), database_id=key.database() or "", namespace_id=key.namespace() or ""
        ),
        path=[entity_types.Key.PathElement(kind=key.kind(), name=key.id())],
    )


def encode(record: RunRecord) -> entity_types.Entity:
    """``record`` as the entity NDB would write for it."""
    properties = {prop._name: _value(prop, getattr(record, prop._code_name)) for prop in _properties()}
    return entity_types.Entity(key=key_pb(record.key), properties=properties)


def decode(entity: entity_types.Entity) -> RunRecord:
    """The RunRecord NDB would read from ``entity`` (properties it does not declare are left out)."""
    stored = entity.properties
    values = {prop._code_name: _decoded(prop, stored[prop._name]) for prop in _properties() if prop._name in stored}
    path = entity.key.path[-1]
    return RunRecord(id=path.name, namespace=entity.key.partition_id.namespace_id or None, **values)


# -- the calls -------------------------------------------------------------------------------


class RecordStore:
    """Lookups with versions, inserts and version-fenced updates of run records, in the
    current NDB context's client (so in its project, database and namespace)."""

    def __init__(self, client: ndb.Client) -> None:
        self._transport = client.stub  # google-cloud-datastore's DatastoreGrpcTransport, over NDB's channel
        self._project = client.project
        self._database = client.database or ""
        params = {"project_id": self._project, **({"database_id": self._database} if self._database else {})}
        self._metadata = (routing_header.to_grpc_metadata(params),)  # type: ignore[no-untyped-call]  # api-core untyped

    @classmethod
    def of_context(cls) -> RecordStore:
        return cls(ndb.get_context().client)

    def lookup(self, run_id: str) -> Versioned | None:
        """One strongly consistent read of the record and its version."""
        return self._found(self._lookup_call(run_id).result())

    def insert(self, record: RunRecord) -> Write:
        """Write ``record`` only if its key holds nothing: one round trip."""
        return self._write(self._commit_call(datastore_types.Mutation(insert=encode(record))))

    def update(self, record: RunRecord | entity_types.Entity, base_version: int) -> Write:
        """Write ``record`` (or its encoded entity) only if the stored entity is still
        ``base_version``: one round trip."""
        entity = record if isinstance(record, entity_types.Entity) else encode(record)
        mutation = datastore_types.Mutation(update=entity, base_version=base_version)
        return self._write(self._commit_call(mutation))

    def lookup_and_insert(self, record: RunRecord) -> tuple[Versioned | None, Write]:
        """The lookup and the insert of one record, in flight together: one round trip of
        latency.  A fresh run's claim lands; any other finds what refused it.

        The two race: what the lookup found may be the record this very insert wrote.
        """
        lookup = self._lookup_call(record.key.id())
        insert = self._commit_call(datastore_types.Mutation(insert=encode(record)))
        written = self._write(insert)
        try:
            found = self._found(lookup.result())
        except grpc.RpcError as exc:
            if isinstance(written, Applied):
                # The claim landed; what the record held before is moot.
                return None, written
            raise api_exceptions.from_grpc_error(exc) from None  # type: ignore[no-untyped-call]
        return found, written

    # -- internals -----------------------------------------------------------------------

    def _lookup_call(self, run_id: str) -> Any:
        request = datastore_types.LookupRequest(
            project_id=self._project,
            database_id=self._database,
            keys=[key_pb(ndb.Key(RunRecord, run_id))],
            read_options=datastore_types.ReadOptions(
                read_consistency=datastore_types.ReadOptions.ReadConsistency.STRONG
            ),
        )
        return self._transport.lookup.future(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata)

    def _commit_call(self, mutation: datastore_types.Mutation) -> Any:
        request = datastore_types.CommitRequest(
            project_id=self._project,
            database_id=self._database,
            mode=datastore_types.CommitRequest.Mode.TRANSACTIONAL,
            single_use_transaction=datastore_types.TransactionOptions(
                read_write=datastore_types.TransactionOptions.ReadWrite()
            ),
            mutations=[mutation],
        )
        return self._transport.commit.future(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata)

    @staticmethod
    def _found(response: datastore_types.LookupResponse) -> Versioned | None:
        if response.deferred:  # one key is never deferred; a doubt is a refusal, never a guess
            raise api_exceptions.ServiceUnavailable("Datastore deferred the lookup of a run record")  # type: ignore[no-untyped-call]
        if not response.found:
            return None
        result = response.found[0]
        return Versioned(decode(result.entity), result.version)

    @staticmethod
    def _write(call: Any) -> Write:
        try:
            response: datastore_types.CommitResponse = call.result()
        except grpc.RpcError as exc:
            error = api_exceptions.from_grpc_error(exc)  # type: ignore[no-untyped-call]
            if isinstance(error, api_exceptions.AlreadyExists):
                return Exists()
            if isinstance(error, api_exceptions.Aborted):
                return Aborted()
            if isinstance(error, _IN_DOUBT):
                return Doubt(error)
            raise error from None
        result = response.mutation_results[0]
        if result.conflict_detected:
            return Conflict()
        return Applied(result.version)


class VersionFence:
    """What a running attempt last wrote of its record and the version that write returned.

    Its next write (a renewal, a downstream note, the finish) is that entity changed, fenced on
    that version: one round trip, no read.  Shared by the attempt's heartbeat and its finish; two
    writes from one version race, and the loser's Conflict sends it to the transactional path,
    which reads what is there.  Dropped after any write it cannot vouch for.
    """

    def __init__(self, entity: entity_types.Entity, version: int) -> None:
        self._lock = threading.Lock()
        self._entity: entity_types.Entity | None = entity
        self._version = version

    def take(self) -> tuple[RunRecord, int] | None:
        """A fresh copy of the record as last written, and its version; None once dropped."""
        with self._lock:
            if self._entity is None:
                return None
            entity, version = self._entity, self._version
        return decode(entity), version

    def advance(self, entity: entity_types.Entity, version: int) -> None:
        with self._lock:
            if self._entity is not None or version > self._version:
                self._entity, self._version = entity, version

    def drop(self) -> None:
        with self._lock:
            self._entity = None
