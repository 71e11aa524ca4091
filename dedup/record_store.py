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
key is taken), ``StaleVersion`` (a fenced update's version is old), ``Aborted`` and ``Refused`` (any
other error: RESOURCE_EXHAUSTED, NOT_FOUND for a record deleted since it was read,
FAILED_PRECONDITION, INVALID_ARGUMENT, ...) were not applied; ``Doubt`` (DEADLINE_EXCEEDED,
UNAVAILABLE, INTERNAL, UNKNOWN) may have been.  No write here raises a Datastore status: the
ledger settles every answer but ``Applied`` in a transaction that reads the record, and every
write carries the attempt id that made it, so a write that did land is recognised as its own
and never applied twice.

Whether a stale version is refused at all is the database's to prove, not ours to assume
(dedup/fence_check.py): ``RecordStore.fence`` says what this process's check found, and the
ledger takes the fenced writes only where it found the fence holds.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.api_core import exceptions as api_exceptions
from google.api_core.gapic_v1 import routing_header
from google.cloud import ndb
from google.cloud.datastore_v1.types import datastore as datastore_types
from google.cloud.datastore_v1.types import entity as entity_types

from dedup import fence_check
from dedup.run_record import RunRecord
from dedup.store import Aborted, Applied, Doubt, Exists, Refused, StaleVersion, Versioned, Write
from dedup.store import Transaction as StoreTransaction
from dedup.transactions import transact

log = logging.getLogger(__name__)

# The cleanup's transactional deletes (where the version fence is not verified): small batches,
# so a claim never waits long on the locks a cleanup holds; one that keeps failing is left for
# the next pass.
CLEANUP_PATIENCE_SECONDS = 10.0
CLEANUP_TRANSACTION_KEYS = 25
# Each hot write's own deadline.  A call that outlives it is a Doubt, which the ledger settles
# by reading the record in its transactional path (with that path's patience).
CALL_TIMEOUT_SECONDS = 10.0
# The most keys Datastore takes in one Lookup (NDB splits its batches at it too).
LOOKUP_KEYS = 1000
# The Lookups one read sends at once outside a transaction.
LOOKUP_WAVE = 16
# NDB marks a compressed blob with this meaning (google.appengine's ZLIB), and reads one by
# zlib's header either way.
COMPRESSED_MEANING = 22
# A hot write that failed with one of these may have landed (``Doubt``).
_IN_DOUBT = (
    api_exceptions.DeadlineExceeded,
    api_exceptions.ServiceUnavailable,
    api_exceptions.InternalServerError,
    api_exceptions.Unknown,
)


# -- the record's one definition, as the entity NDB writes -------------------------------


def _properties(model: type[Any]) -> Iterator[Any]:
    """A model's declared properties (NDB's public ``_properties``: its names are the model's)."""
    return iter(model._properties.values())


# The raw protobuf classes under google-cloud-datastore's proto-plus types: set and read field by
# field, the codec costs a tenth of building the wrappers (``make bench``'s CPU column); the hot
# calls' requests are built raw too, and wrapped (which copies nothing) to be sent.
_RawEntity = entity_types.Entity.pb()
_RawLookupRequest = datastore_types.LookupRequest.pb()
_RawCommitRequest = datastore_types.CommitRequest.pb()
_RawMutation = datastore_types.Mutation.pb()


def _insert(entity: entity_types.Entity) -> Any:
    # Built through proto-plus, as NDB builds its writes: the entity's map then goes out in the
    # order NDB's does, and the emulator keeps the version of an identical rewrite (a CopyFrom
    # of the raw entity reorders the map, and the emulator then calls the same entity changed).
    return datastore_types.Mutation.pb(datastore_types.Mutation(insert=entity))


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _set_json(compressed: bool) -> Callable[[Any, Any], None]:
    def set_json(value: Any, target: Any) -> None:
        blob = json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        target.exclude_from_indexes = True  # NDB never indexes a blob
        if compressed:
            target.blob_value, target.meaning = zlib.compress(blob), COMPRESSED_MEANING
        else:
            target.blob_value = blob

    return set_json


def _set_timestamp(value: datetime.datetime, target: Any) -> None:
    since = (value if value.tzinfo else value.replace(tzinfo=datetime.UTC)) - _EPOCH
    stamp = target.timestamp_value
    stamp.seconds, stamp.nanos = since.days * 86400 + since.seconds, since.microseconds * 1000


def _set_integer(value: Any, target: Any) -> None:
    target.integer_value = int(value)


def _set_boolean(value: Any, target: Any) -> None:
    target.boolean_value = bool(value)


def _set_string(value: Any, target: Any) -> None:
    target.string_value = str(value)


type _Plan = tuple[tuple[str, str, bool, Callable[[Any, Any], None]], ...]


_PLANS: dict[type[Any], _Plan] = {}


def _plan(model: type[Any]) -> _Plan:
    plan = _PLANS.get(model)
    if plan is None:
        plan = _PLANS[model] = _plan_of(model)
    return plan


def _plan_of(model: type[Any]) -> _Plan:
    """How ``model``'s properties are written, as NDB writes them: per property its stored name,
    its attribute, whether it is left out of indexes, and how a value is set.  Worked out once
    per model, so encoding a record is a loop with no type tests."""
    plan = []
    for prop in _properties(model):
        setter: Callable[[Any, Any], None]
        if isinstance(prop, ndb.JsonProperty):
            setter = _set_json(bool(prop._compressed))
        elif isinstance(prop, ndb.DateTimeProperty):
            setter = _set_timestamp
        elif isinstance(prop, ndb.BooleanProperty):
            setter = _set_boolean
        elif isinstance(prop, ndb.IntegerProperty):
            setter = _set_integer
        elif isinstance(prop, ndb.StringProperty | ndb.TextProperty):
            setter = _set_string
        else:
            raise TypeError(f"{prop._code_name}: no encoding for {type(prop).__name__}")
        plan.append((prop._name, prop._code_name, not prop._indexed, setter))
    return tuple(plan)


def _decoded(prop: Any, value: Any) -> Any:
    """The value NDB would read of ``prop`` from the raw ``Value`` ``value``."""
    kind = value.WhichOneof("value_type")
    if kind in (None, "null_value"):
        return None
    if isinstance(prop, ndb.JsonProperty):
        blob = value.blob_value if kind == "blob_value" else value.string_value.encode()
        if blob.startswith((b"x\x9c", b"x\x01", b"x\xda", b"x^")):  # zlib's headers, as NDB reads them
            blob = zlib.decompress(blob)
        return json.loads(blob)
    if kind == "timestamp_value":  # microseconds, as NDB keeps them
        stamp = value.timestamp_value
        return _EPOCH + datetime.timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)
    if kind == "integer_value":
        return value.integer_value
    if kind == "boolean_value":
        return value.boolean_value
    if kind == "string_value":
        return value.string_value
    raise TypeError(f"{prop._code_name}: stored as {kind}")


_RawKey = entity_types.Key.pb()


def _raw_key(key: ndb.Key) -> Any:
    """``key`` as a raw protobuf Key (its last path element, as every key here has one).

    Read through ``flat()``, which NDB keeps: ``id()`` and ``kind()`` copy the whole path each call.
    """
    raw = _RawKey()
    partition = raw.partition_id
    partition.project_id = key.project()
    partition.database_id = key.database() or ""
    partition.namespace_id = key.namespace() or ""
    flat = key.flat()
    element = raw.path.add()
    element.kind = flat[-2]
    if isinstance(flat[-1], int):
        element.id = flat[-1]
    else:
        element.name = flat[-1]
    return raw


def key_pb(key: ndb.Key) -> entity_types.Key:
    wrapped: entity_types.Key = entity_types.Key.wrap(_raw_key(key))
    return wrapped


def _ndb_key(key: entity_types.Key, model: type[Any]) -> ndb.Key:
    element = key.path[-1]
    name_or_id = element.name or element.id
    return ndb.Key(model, name_or_id, namespace=key.partition_id.namespace_id or None)


def encode(entity: Any) -> entity_types.Entity:
    """An NDB model instance (a RunRecord, a JobLock) as the entity NDB would write for it."""
    raw = _RawEntity()
    raw.key.CopyFrom(_raw_key(entity.key))
    properties = raw.properties
    for name, attribute, unindexed, setter in _plan(type(entity)):
        value = getattr(entity, attribute)
        target = properties[name]
        target.exclude_from_indexes = unindexed
        if value is None:
            target.null_value = 0
        else:
            setter(value, target)
    wrapped: entity_types.Entity = entity_types.Entity.wrap(raw)
    return wrapped


def decode(entity: entity_types.Entity, model: Any = RunRecord) -> Any:
    """The ``model`` instance NDB would read from ``entity`` (properties it does not declare are left out)."""
    raw = entity if isinstance(entity, _RawEntity) else entity_types.Entity.pb(entity)
    stored = raw.properties
    values = {
        prop._code_name: _decoded(prop, stored[prop._name]) for prop in _properties(model) if prop._name in stored
    }
    return model(key=_ndb_key(raw.key, model), **values)


# -- the calls -------------------------------------------------------------------------------


class RecordStore:
    """Lookups with versions, inserts and version-fenced updates of run records, in the
    current NDB context's client (so in its project, database and namespace)."""

    def __init__(self, client: ndb.Client) -> None:
        self._transport = client.stub  # google-cloud-datastore's DatastoreGrpcTransport, over NDB's channel
        self._project = client.project
        self._database = client.database or ""
        self._database_id = fence_check.database_of(client)
        params = {"project_id": self._project, **({"database_id": self._database} if self._database else {})}
        self._metadata = (routing_header.to_grpc_metadata(params),)  # type: ignore[no-untyped-call]  # api-core untyped

    @classmethod
    def of_context(cls) -> RecordStore:
        return cls(ndb.get_context().client)

    @property
    def database(self) -> str:
        """The database's id ("" for the project's default)."""
        return self._database

    @property
    def fence(self) -> fence_check.FenceCheck:
        """What this process's check found of this database's version fence."""
        return fence_check.current(self._database_id)

    @property
    def fenced(self) -> bool:
        """Whether writes fenced on a version may be trusted to be refused when stale."""
        return self.fence.mode is fence_check.FenceMode.VERSION

    def lookup(self, run_id: str) -> Versioned | None:
        """One strongly consistent read of the record and its version."""
        return self._found(_call_future(self._lookup_call(ndb.Key(RunRecord, run_id))))

    def lookup_many(self, keys: list[ndb.Key]) -> list[Versioned | None]:
        """The entities of ``keys`` (any model's; in order, None where absent) and their versions:
        one round trip per LOOKUP_KEYS."""
        found, _ = _read(self._transport, self._metadata, self._project, self._database, keys, lambda: None)
        return found

    def delete_unchanged(self, doomed: list[Versioned]) -> int:
        """Delete each record only if it is still the version read: one written since (claimed
        afresh, renewed) stays.  How many went.  One fenced commit where the fence is verified,
        else a transaction that reads the versions again."""
        if not doomed:
            return 0
        if not self.fenced:
            return self._delete_unchanged_in_transaction(doomed)
        request = datastore_types.CommitRequest(
            project_id=self._project,
            database_id=self._database,
            mode=datastore_types.CommitRequest.Mode.NON_TRANSACTIONAL,
            mutations=[
                datastore_types.Mutation(delete=key_pb(found.record.key), base_version=found.version)
                for found in doomed
            ],
        )
        response = _call(self._transport.commit, request, self._metadata)
        return sum(1 for result in response.mutation_results if not result.conflict_detected)

    def _delete_unchanged_in_transaction(self, doomed: list[Versioned]) -> int:
        """In transactions of CLEANUP_TRANSACTION_KEYS records each; a batch that keeps failing
        (contention with claims, an outage) stays for the next pass."""
        deleted = 0
        for start in range(0, len(doomed), CLEANUP_TRANSACTION_KEYS):
            versions = {found.record.key: found.version for found in doomed[start : start + CLEANUP_TRANSACTION_KEYS]}

            def body(transaction: StoreTransaction, versions: dict[ndb.Key, int] = versions) -> int:
                keys = list(versions)
                unchanged = [
                    key
                    for key, now in zip(keys, transaction.get(keys), strict=True)
                    if now and now.version == versions[key]
                ]
                for key in unchanged:
                    transaction.delete(key)
                return len(unchanged)

            try:
                went, _ = transact(body, CLEANUP_PATIENCE_SECONDS, self)
            except api_exceptions.GoogleAPICallError as exc:
                log.warning("cleanup: %d expired records left for the next pass (%s)", len(versions), exc)
                continue
            deleted += went
        return deleted

    def transaction(self, previous: bytes | None = None, begin_in_read: bool | None = None) -> Transaction:
        """``previous``: a transaction of the same body that aborted (it keeps its place in line).
        ``begin_in_read``: begun by its first Lookup (default: where the start-up check found it works)."""
        begins = self.fence.begins_in_read if begin_in_read is None else begin_in_read
        return Transaction(self._transport, self._project, self._database, self._metadata, previous, begins)

    def insert(self, record: RunRecord | entity_types.Entity) -> Write:
        """Write ``record`` (or its encoded entity) only if its key holds nothing: one round trip."""
        entity = record if isinstance(record, entity_types.Entity) else encode(record)
        return self._commit([_insert(entity)])

    def delete_if(self, key: ndb.Key, version: int | None) -> Write:
        """Delete ``key`` only if it is still ``version`` (None: whatever it is): one round trip."""
        mutation = _RawMutation()
        mutation.delete.CopyFrom(_raw_key(key))
        if version is not None:
            mutation.base_version = version
        return self._commit([mutation], transactional=False)

    def lookup_entity(self, key: ndb.Key) -> entity_types.Entity | None:
        """One strongly consistent read of any entity, as stored."""
        found = datastore_types.LookupResponse.pb(_call_future(self._lookup_call(key))).found
        return entity_types.Entity.wrap(found[0].entity) if found else None

    def update(
        self,
        record: RunRecord | entity_types.Entity,
        base_version: int,
        delete: tuple[ndb.Key, int] | None = None,
    ) -> Write:
        """Write ``record`` (or its encoded entity) only if the stored entity is still
        ``base_version``: one round trip.  The answer is the record's.

        ``delete``: a key and its version, deleted in the same commit only if still that version
        (a finished run's job lock).  A version fences one entity, not the commit, so either
        may land without the other; the caller must be right in all four cases.
        """
        entity = record if isinstance(record, entity_types.Entity) else encode(record)
        mutations = [datastore_types.Mutation.pb(datastore_types.Mutation(update=entity, base_version=base_version))]
        if delete is not None:
            doomed = _RawMutation(base_version=delete[1])
            doomed.delete.CopyFrom(_raw_key(delete[0]))
            mutations.append(doomed)
        # The version is the fence, and it is checked as the entity is written: no transaction.
        return self._commit(mutations, transactional=False)

    def lookup_and_insert(
        self, record: RunRecord, entity: entity_types.Entity | None = None
    ) -> tuple[Versioned | None, Write]:
        """The lookup and the insert of one record, in flight together: one round trip of
        latency.  A fresh run's claim lands; any other finds what refused it.

        The two race: what the lookup found may be the record this very insert wrote.
        ``entity``: the record already encoded (``encode(record)``), not to encode it twice.
        """
        lookup = self._lookup_call(record.key)  # in flight while the insert is sent and answered
        written = self._commit([_insert(entity if entity is not None else encode(record))])
        try:
            found = self._found(_call_future(lookup))
        except api_exceptions.GoogleAPICallError as exc:
            # Applied: the claim landed, and what the record held before is moot.  Anything else
            # (taken, refused, in doubt) is the caller's to settle in a transaction that reads the
            # record: an insert in doubt may be this very claim's, which that read recognises.
            log.info("run %s: the claim's lookup failed (%s); its insert was %s", record.key.id(), exc, written)
            return None, written
        return found, written

    # -- internals -----------------------------------------------------------------------

    def _lookup_call(self, key: ndb.Key) -> Any:
        """A strongly consistent Lookup of one key, in flight (a gRPC future)."""
        raw = _RawLookupRequest(project_id=self._project, database_id=self._database)
        raw.keys.append(_raw_key(key))
        raw.read_options.read_consistency = datastore_types.ReadOptions.ReadConsistency.STRONG
        request = datastore_types.LookupRequest.wrap(raw)
        return self._transport.lookup.future(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata)

    def _commit(self, mutations: list[Any], transactional: bool = True) -> Write:
        """The raw ``mutations`` in one Commit (a single-use transaction's, if ``transactional``),
        waited for in this thread (a blocking gRPC call: no future, so no thread of gRPC's to poll
        for it), and what its answer means."""
        mode = datastore_types.CommitRequest.Mode
        raw = _RawCommitRequest(
            project_id=self._project,
            database_id=self._database,
            mode=mode.TRANSACTIONAL if transactional else mode.NON_TRANSACTIONAL,
        )
        if transactional:
            raw.single_use_transaction.read_write.SetInParent()
        raw.mutations.extend(mutations)
        request = datastore_types.CommitRequest.wrap(raw)
        try:
            response = self._transport.commit(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = api_exceptions.from_grpc_error(exc)  # type: ignore[no-untyped-call]
            if isinstance(error, api_exceptions.AlreadyExists):
                return Exists()
            if isinstance(error, api_exceptions.Aborted):
                return Aborted()
            if isinstance(error, _IN_DOUBT):
                return Doubt(error)
            return Refused(error)  # never raised: the caller's transaction settles it
        result = datastore_types.CommitResponse.pb(response).mutation_results[0]
        if result.conflict_detected:
            return StaleVersion()
        return Applied(result.version)

    @staticmethod
    def _found(response: datastore_types.LookupResponse) -> Versioned | None:
        raw = datastore_types.LookupResponse.pb(response)
        if raw.deferred:  # one key is never deferred; a doubt is a refusal, never a guess
            raise api_exceptions.ServiceUnavailable("Datastore deferred the lookup of a run record")  # type: ignore[no-untyped-call]
        if not raw.found:
            return None
        result = raw.found[0]
        return Versioned(decode(result.entity), result.version)


class Transaction:
    """One read-write transaction, begun by its first read (``ReadOptions.new_transaction``): the
    begin travels with the Lookup, so a read-decide-write costs two round trips.  Writes are kept
    until ``commit``; one that wrote nothing rolls back without waiting for the answer."""

    def __init__(
        self,
        transport: Any,
        project: str,
        database: str,
        metadata: tuple[Any, ...],
        previous: bytes | None = None,
        begin_in_read: bool = True,
    ) -> None:
        self._transport, self._project, self._database, self._metadata = transport, project, database, metadata
        self.id: bytes | None = None
        self.began: bytes | None = None  # its id, kept after it ended: the next try's ``previous``
        self._previous = previous
        self._begin_in_read = begin_in_read
        self._mutations: list[datastore_types.Mutation] = []
        self._puts: list[ndb.Key | None] = []  # per mutation: the key put, None for a delete
        self.versions: dict[ndb.Key, int] = {}  # after the commit: what each put's write gave it

    def get(self, keys: list[ndb.Key]) -> list[Versioned | None]:
        """The entities of ``keys`` (in order; None where absent) as this transaction reads them."""

        if self.id is None and not self._begin_in_read:  # a round trip of its own (dedup/fence_check.py)
            request = datastore_types.BeginTransactionRequest(
                project_id=self._project, database_id=self._database, transaction_options=self._options()
            )
            self.id = self.began = _call(self._transport.begin_transaction, request, self._metadata).transaction

        def options() -> datastore_types.ReadOptions:
            if self.id is not None:
                return datastore_types.ReadOptions(transaction=self.id)
            return datastore_types.ReadOptions(new_transaction=self._options())

        found, begun = _read(self._transport, self._metadata, self._project, self._database, keys, options)
        if self.id is None:
            self.id = self.began = begun
        return found

    def _options(self) -> datastore_types.TransactionOptions:
        """Read-write; a retry names the try that aborted, so it keeps that try's place in line
        for the locks a pessimistic database queues (``previous_transaction``)."""
        read_write = datastore_types.TransactionOptions.ReadWrite()
        if self._previous:
            read_write.previous_transaction = self._previous
        return datastore_types.TransactionOptions(read_write=read_write)

    def put(self, entity: Any) -> None:
        self._mutations.append(datastore_types.Mutation(upsert=encode(entity)))
        self._puts.append(entity.key)

    def put_entity(self, entity: entity_types.Entity) -> None:
        """An entity as stored (no model): its version is not kept."""
        self._mutations.append(datastore_types.Mutation(upsert=entity))
        self._puts.append(None)

    def delete(self, key: ndb.Key) -> None:
        self._mutations.append(datastore_types.Mutation(delete=key_pb(key)))
        self._puts.append(None)

    def commit(self) -> None:
        """Write what was put and deleted, atomically; with nothing to write, end the transaction."""
        if not self._mutations:
            self.rollback()
            return
        request = datastore_types.CommitRequest(
            project_id=self._project,
            database_id=self._database,
            mode=datastore_types.CommitRequest.Mode.TRANSACTIONAL,
            mutations=self._mutations,
        )
        if self.id is None:  # nothing read: a single-use transaction
            request.single_use_transaction = self._options()
        else:
            request.transaction = self.id
        self.id = None  # committed or failed, it is over (a failed commit ends it)
        response = _call(self._transport.commit, request, self._metadata)
        for key, result in zip(self._puts, response.mutation_results, strict=True):
            if key is not None:
                self.versions[key] = result.version

    def rollback(self) -> None:
        """End a transaction that will not commit, without waiting for the answer."""
        if self.id is None:
            return
        request = datastore_types.RollbackRequest(
            project_id=self._project, database_id=self._database, transaction=self.id
        )
        self.id = None
        try:
            call = self._transport.rollback.future(request, timeout=CALL_TIMEOUT_SECONDS, metadata=self._metadata)
        except Exception:  # a transaction not ended ends by itself
            return
        with _ROLLBACKS_LOCK:  # a dropped gRPC future may be cancelled: keep it until answered
            _ROLLBACKS_IN_FLIGHT.add(call)
        call.add_done_callback(_rollback_done)


_ROLLBACKS_IN_FLIGHT: set[Any] = set()
_ROLLBACKS_LOCK = threading.Lock()


def _rollback_done(call: Any) -> None:
    with _ROLLBACKS_LOCK:
        _ROLLBACKS_IN_FLIGHT.discard(call)


def _read(
    transport: Any,
    metadata: tuple[Any, ...],
    project: str,
    database: str,
    keys: list[ndb.Key],
    options: Callable[[], datastore_types.ReadOptions | None],
) -> tuple[list[Versioned | None], bytes | None]:
    """The entities of ``keys`` (in order; None where absent), each as its model reads it, asking
    again for any key Datastore defers, LOOKUP_KEYS at most per Lookup; and the transaction the
    first Lookup began, if it did.  ``options``: the read options of each pass (a transaction
    begun by the first, then used)."""
    wanted = list(keys)
    found: dict[tuple[str, Any], Versioned] = {}
    begun: bytes | None = None
    models = {key.kind(): ndb.Model._lookup_model(key.kind()) for key in keys}
    while wanted:
        read_options = options() if begun is None else datastore_types.ReadOptions(transaction=begun)
        # Outside a transaction the batches go LOOKUP_WAVE at a time (a page's thousands of slots
        # cost one round trip, not one per LOOKUP_KEYS; an audit after a long outage, with a
        # million, never has a thousand calls in flight); a transaction's first Lookup begins it,
        # so it goes alone.
        size = LOOKUP_KEYS * (LOOKUP_WAVE if read_options is None else 1)
        batches = [wanted[start : start + LOOKUP_KEYS] for start in range(0, min(size, len(wanted)), LOOKUP_KEYS)]
        wanted = wanted[sum(len(batch) for batch in batches) :]
        requests = []
        for batch in batches:
            request = datastore_types.LookupRequest(
                project_id=project, database_id=database, keys=[key_pb(key) for key in batch]
            )
            if read_options is not None:
                request.read_options = read_options
            requests.append(request)
        if len(requests) == 1:  # the usual read: a blocking call, no gRPC thread to poll a future
            responses = [_call(transport.lookup, requests[0], metadata)]
        else:
            calls = [transport.lookup.future(r, timeout=CALL_TIMEOUT_SECONDS, metadata=metadata) for r in requests]
            responses = [_call_future(call) for call in calls]
        for batch, response in zip(batches, responses, strict=True):
            begun = begun or response.transaction or None
            for result in response.found:
                element = result.entity.key.path[-1]
                found[(element.kind, element.name or element.id)] = Versioned(
                    decode(result.entity, models[element.kind]), result.version
                )
            deferred = {(key.path[-1].kind, key.path[-1].name or key.path[-1].id) for key in response.deferred}
            wanted = [key for key in batch if (key.kind(), key.id()) in deferred] + wanted
    return [found.get((key.kind(), key.id())) for key in keys], begun


def _call_future(call: Any) -> Any:
    """A call in flight, waited for, its gRPC error raised as google-api-core's."""
    try:
        return call.result()
    except grpc.RpcError as exc:
        raise api_exceptions.from_grpc_error(exc) from None  # type: ignore[no-untyped-call]


def _call(method: Any, request: Any, metadata: tuple[Any, ...]) -> Any:
    """A unary call, its gRPC error raised as google-api-core's (what the retry loop knows: dedup/transactions.py)."""
    try:
        return method(request, timeout=CALL_TIMEOUT_SECONDS, metadata=metadata)
    except grpc.RpcError as exc:
        raise api_exceptions.from_grpc_error(exc) from None  # type: ignore[no-untyped-call]


class VersionFence:
    """What a running attempt last wrote of its record and the version that write returned.

    Its next write (a renewal, a downstream note, the finish) is that record changed, fenced on
    that version: one round trip, no read.  One writer at a time: while the attempt's heartbeat
    writes, its finish finds the fence taken and goes to the transactional path, which reads what
    is there (as it does after any write the fence cannot vouch for).  (A renewal under a job's
    lock is a transaction, which takes no fence.)  The fence is only ever a guess: a write fenced
    on a version that is not the entity's is refused, so a wrong guess costs a round trip, never
    a wrong write.
    """

    def __init__(self, record: RunRecord, version: int, lock_version: int | None = None) -> None:
        """``lock_version``: for a job with ``overlap: forbid``, the version of its lock as the
        attempt last wrote it (the finish deletes the lock fenced on it)."""
        self._lock = threading.Lock()
        self._record: RunRecord | None = record
        self._version = version
        self.lock_version = lock_version
        self._taken = False

    def take(self) -> tuple[RunRecord, int] | None:
        """The record as last written, and its version, for one write; None when dropped or another
        write has it (until that write's ``advance`` or ``drop``).  Not a copy: the write edits it,
        and a write that does not land drops the fence, so an edit that did not land is never
        fenced on."""
        with self._lock:
            if self._record is None or self._taken:
                return None
            self._taken = True
            return self._record, self._version

    def advance(self, record: RunRecord, version: int, lock_version: int | None = None) -> None:
        """``record`` was written and given ``version`` (and the job's lock ``lock_version``, when
        written with it): the next write is fenced on it."""
        with self._lock:
            if self._record is not None or version > self._version:
                self._record, self._version = record, version
                if lock_version is not None:
                    self.lock_version = lock_version
            self._taken = False

    def drop(self) -> None:
        with self._lock:
            self._record, self._taken = None, False
