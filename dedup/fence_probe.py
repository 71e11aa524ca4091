"""The start-up check of dedup/fence_check.py: does this database refuse a stale version?

Each process proves it once, off the request path, on scratch entities of their own kind
(``DedupFenceProbe``, a name of their own per check): a stale-version update and a stale-version
delete must both come back not applied, and what is stored is read back to be sure.  It also
checks that a transaction begun by its first read commits (the Firestore emulator's does not).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable

from google.api_core import exceptions as api_exceptions
from google.cloud import ndb
from google.cloud.datastore_v1.types import entity as entity_types

from dedup.fence_check import FenceCheck, FenceMode, current_or_none, database_of, record
from dedup.record_store import RecordStore, Transaction, key_pb
from dedup.store import Applied, Refused, StaleVersion, Write

log = logging.getLogger(__name__)


class DedupFenceProbe(ndb.Model):  # type: ignore[misc]  # google-cloud-ndb has no types: ndb.Model is Any
    """The check's scratch entity: a kind of its own, deleted when the check ends."""

    _use_cache = False
    _use_global_cache = False

    step = ndb.IntegerProperty(indexed=False)


PROBE_KIND = DedupFenceProbe._get_kind()


# One check at a time in a process: a second caller waits for the first's answer.
_checking = threading.Lock()
# A check that could not run (no client yet, Datastore unreachable) is tried again this often, this
# many times, by the start-up thread; meanwhile the transactional path holds.
RETRY_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0)
COULD_NOT_RUN = "the check could not run"


def verify(client: ndb.Client, probe: Callable[[], FenceCheck] | None = None, again: bool = False) -> FenceCheck:
    """Check ``client``'s database once in this process (a later call returns the first answer;
    ``again``: unless that answer was that the check could not run), log what it found, and
    keep it for every RecordStore of that database."""
    database = database_of(client)
    with _checking:
        done = current_or_none(database)
        if done is not None and not (again and done.reason.startswith(COULD_NOT_RUN)):
            return done
        with client.context():
            try:
                check = probe() if probe is not None else probe_fence()
            except Exception as exc:  # the check could not run: the path safe under every reading
                check = could_not_run(exc)
        record(database, check)
    report(check)
    return check


def could_not_run(exc: BaseException) -> FenceCheck:
    return FenceCheck(FenceMode.TRANSACTION, f"{COULD_NOT_RUN} ({type(exc).__name__}: {exc})", begins_in_read=False)


def report(check: FenceCheck) -> None:
    """One line: INFO where the fence holds; a WARNING naming the cost where it does not."""
    if check.mode is FenceMode.VERSION:
        log.info("Datastore fence verified: %s", check.describe())
    else:
        log.warning(
            "Datastore fence not verified, every fenced write goes through a transaction that reads first: %s",
            check.describe(),
        )


def verify_in_background(
    client: Callable[[], ndb.Client], sleep: Callable[[float], object] = time.sleep
) -> threading.Thread:
    """``verify`` on a thread of its own, so start-up and requests never wait for it (they take
    the transactional path until it answers).  ``client``: made on that thread, where credentials
    may take a moment.  A check that could not run is tried again (RETRY_SECONDS)."""

    def check() -> None:
        for wait in (*RETRY_SECONDS, None):
            try:
                made = client()
            except Exception as exc:  # no client yet, no credentials: the transactional path holds
                report(could_not_run(exc))
            else:
                if not verify(made, again=True).reason.startswith(COULD_NOT_RUN):
                    return
            if wait is None:
                return
            sleep(wait)

    thread = threading.Thread(target=check, name="fence-check", daemon=True)
    thread.start()
    return thread


def probe_fence() -> FenceCheck:
    """The check itself, in the current NDB context: about ten round trips on scratch entities."""
    check = _probe_version_fence()
    return dataclasses.replace(check, begins_in_read=_probe_begin_in_read())


def _probe_begin_in_read() -> bool:
    """Whether a transaction begun by its Lookup commits (on a scratch key of its own: where it
    does not, the lock its read took may stay until the database expires it)."""
    store = RecordStore.of_context()
    key = ndb.Key(PROBE_KIND, f"probe-{uuid.uuid4().hex}")
    transaction: Transaction = store.transaction(begin_in_read=True)
    try:
        transaction.get([key])
        transaction.put_entity(entity_types.Entity(key=key_pb(key)))
        transaction.commit()
    except Exception as exc:
        transaction.rollback()
        log.info("a transaction begun by its read did not commit (%s): transactions begin on their own", exc)
        return False
    store.delete_if(key, None)
    return True


def refused_as_stale(answer: Write) -> bool:
    """Whether ``answer`` says a stale version was refused, under either reading of the contract."""
    return isinstance(answer, StaleVersion) or (
        isinstance(answer, Refused)
        and isinstance(answer.error, api_exceptions.FailedPrecondition | api_exceptions.InvalidArgument)
    )


def _probe_version_fence() -> FenceCheck:
    store = RecordStore.of_context()
    key = ndb.Key(PROBE_KIND, f"probe-{uuid.uuid4().hex}")
    raw_key = key_pb(key)

    def entity(step: int) -> entity_types.Entity:
        return entity_types.Entity(key=raw_key, properties={"step": entity_types.Value(integer_value=step)})

    def step_stored() -> int | None:
        found = store.lookup_entity(key)
        return None if found is None else int(found.properties["step"].integer_value)

    try:
        first = store.insert(entity(1))
        if not isinstance(first, Applied):  # (one in doubt may have landed: deleted below)
            return FenceCheck(FenceMode.TRANSACTION, f"the scratch entity could not be written ({first})")
        second = store.update(entity(2), first.version)
        if not isinstance(second, Applied):
            return FenceCheck(
                FenceMode.TRANSACTION, f"an update fenced on the current version was not applied ({second})"
            )
        # Refused as stale: a conflict, or the whole commit refused as the contract's other reading
        # would (FAILED_PRECONDITION, INVALID_ARGUMENT).  An answer in doubt, or any other error
        # (quota, permissions), proves nothing; what is stored is read back either way.
        stale_update = store.update(entity(3), first.version)
        if not refused_as_stale(stale_update) or step_stored() != 2:
            return FenceCheck(
                FenceMode.TRANSACTION, f"an update fenced on a stale version was not refused ({stale_update})"
            )
        stale_delete = store.delete_if(key, first.version)
        if not refused_as_stale(stale_delete) or step_stored() != 2:
            return FenceCheck(
                FenceMode.TRANSACTION, f"a delete fenced on a stale version was not refused ({stale_delete})"
            )
        return FenceCheck(FenceMode.VERSION, "the database refused an update and a delete fenced on a stale version")
    finally:
        store.delete_if(key, None)  # the scratch entity, whatever its version now
