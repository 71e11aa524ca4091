"""Whether this database refuses a stale version-fenced write: checked, never assumed.

The hot path's later writes (a claim over a released or expired record, every renewal and
finish, the ``overlap: forbid`` lock's release, the cleanup's deletes) are fenced by Datastore
itself: a mutation carrying ``base_version`` is "not applied" when the entity moved on (the v1
API's ``Mutation.base_version``).  The legacy Datastore emulator honours that; the Firestore
emulator in Datastore mode applies a stale update or delete anyway and reports no conflict.
Production runs on the Firestore backend and nobody documents which way it goes.

So each process proves it once, off the request path, on a scratch entity of its own kind
(``DedupFenceProbe``, a name of its own per check): a stale-version update and a stale-version
delete must both come back not applied.  Only then does the ledger take the fenced fast path
(``FenceMode.VERSION``); otherwise, and until the check has answered, every write that relies
on a fence goes through a transaction that reads the record and checks the attempt id
(``FenceMode.TRANSACTION``), which is safe under every reading of the contract.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import uuid
from collections.abc import Callable

from google.cloud import ndb
from google.cloud.datastore_v1.types import entity as entity_types

log = logging.getLogger(__name__)

PROBE_KIND = "DedupFenceProbe"


class FenceMode(enum.StrEnum):
    VERSION = "version"  # the database refuses stale versions: fenced writes in one round trip
    TRANSACTION = "transaction"  # it does not, or nobody checked: a transaction reads and decides


# A fresh run's sequential Datastore round trips on each path (``make bench`` measures them):
# the claim's lookup and insert travel together; the finish is one fenced commit, or a
# transaction's read and commit.
ROUND_TRIPS_PER_FRESH_RUN = {FenceMode.VERSION: 2, FenceMode.TRANSACTION: 3}


@dataclasses.dataclass(frozen=True)
class FenceCheck:
    """What the check found: the path in force, and why, in words an operator can act on."""

    mode: FenceMode
    reason: str

    @property
    def round_trips_per_fresh_run(self) -> int:
        return ROUND_TRIPS_PER_FRESH_RUN[self.mode]

    def describe(self) -> str:
        return f"{self.mode} fence ({self.round_trips_per_fresh_run} round trips per fresh run): {self.reason}"


UNCHECKED = FenceCheck(FenceMode.TRANSACTION, "the start-up check has not answered yet")

type DatabaseId = tuple[str, str]  # (project, database): one database's check, whichever route reaches it


def database_of(client: ndb.Client) -> DatabaseId:
    return (str(client.project), str(client.database or ""))


_checks: dict[DatabaseId, FenceCheck] = {}
_checks_lock = threading.Lock()


def current(database: DatabaseId) -> FenceCheck:
    """The check that holds for ``database`` in this process (``UNCHECKED`` until one answered)."""
    return _checks.get(database, UNCHECKED)


def record(database: DatabaseId, check: FenceCheck) -> None:
    with _checks_lock:
        _checks[database] = check


def forget(database: DatabaseId) -> None:
    """Back to unchecked (tests that prove what each path does)."""
    with _checks_lock:
        _checks.pop(database, None)


def verify(client: ndb.Client, probe: Callable[[], FenceCheck] | None = None) -> FenceCheck:
    """Check ``client``'s database once in this process (a later call returns the first answer),
    log what it found, and keep it for every RecordStore of that database."""
    database = database_of(client)
    with _checks_lock:
        done = _checks.get(database)
    if done is not None:
        return done
    with client.context():
        try:
            check = probe() if probe is not None else probe_fence()
        except Exception as exc:  # the check could not run: the path safe under every reading
            check = FenceCheck(FenceMode.TRANSACTION, f"the check could not run ({type(exc).__name__}: {exc})")
    record(database, check)
    if check.mode is FenceMode.VERSION:
        log.info("Datastore fence verified: %s", check.describe())
    else:
        log.warning(
            "Datastore fence not verified, every fenced write goes through a transaction that reads first: %s",
            check.describe(),
        )
    return check


def verify_in_background(client: Callable[[], ndb.Client]) -> threading.Thread:
    """``verify`` on a thread of its own, so start-up and requests never wait for it (they take
    the transactional path until it answers).  ``client``: made on that thread, where credentials
    may take a moment."""

    def check() -> None:
        try:
            verify(client())
        except Exception:  # no client, no credentials: stay on the transactional path
            log.warning("Datastore fence check failed to start; fenced writes go through transactions", exc_info=True)

    thread = threading.Thread(target=check, name="fence-check", daemon=True)
    thread.start()
    return thread


def probe_fence() -> FenceCheck:
    """The check itself, in the current NDB context: seven round trips on a scratch entity."""
    from dedup.record_store import Applied, Conflict, RecordStore, Refused, key_pb

    store = RecordStore.of_context()
    key = ndb.Key(PROBE_KIND, f"probe-{uuid.uuid4().hex}")
    raw_key = key_pb(key)

    def entity(step: int) -> entity_types.Entity:
        return entity_types.Entity(key=raw_key, properties={"step": entity_types.Value(integer_value=step)})

    def step_stored() -> int | None:
        found = store.lookup_entity(key)
        return None if found is None else int(found.properties["step"].integer_value)

    first = store.insert(entity(1))
    if not isinstance(first, Applied):
        return FenceCheck(FenceMode.TRANSACTION, f"the scratch entity could not be written ({first})")
    try:
        second = store.update(entity(2), first.version)
        if not isinstance(second, Applied):
            return FenceCheck(
                FenceMode.TRANSACTION, f"an update fenced on the current version was not applied ({second})"
            )
        # Refused means refused for sure (a conflict, or an error that says not applied); an answer
        # in doubt proves nothing, and what is stored is read back either way.
        stale_update = store.update(entity(3), first.version)
        if not isinstance(stale_update, Conflict | Refused) or step_stored() != 2:
            return FenceCheck(
                FenceMode.TRANSACTION, f"an update fenced on a stale version was not refused ({stale_update})"
            )
        stale_delete = store.delete_if(key, first.version)
        if not isinstance(stale_delete, Conflict | Refused) or step_stored() != 2:
            return FenceCheck(
                FenceMode.TRANSACTION, f"a delete fenced on a stale version was not refused ({stale_delete})"
            )
        return FenceCheck(FenceMode.VERSION, "the database refused an update and a delete fenced on a stale version")
    finally:
        store.delete_if(key, None)  # the scratch entity, whatever its version now
