"""Whether this database refuses a stale version-fenced write: checked, never assumed.

The hot path's later writes (a claim over a released or expired record, every renewal and
finish, the ``overlap: forbid`` lock's release, the cleanup's deletes) are fenced by Datastore
itself: a mutation carrying ``base_version`` is "not applied" when the entity moved on (the v1
API's ``Mutation.base_version``).  The legacy Datastore emulator honours that; the Firestore
emulator in Datastore mode applies a stale update or delete anyway and reports no conflict.
Production runs on the Firestore backend and nobody documents which way it goes.

So each process proves it once, off the request path (dedup/fence_probe.py): a stale-version
update and a stale-version delete must both come back not applied.  Only then does the ledger take the fenced fast path
(``FenceMode.VERSION``); otherwise, and until the check has answered, every write that relies
on a fence goes through a transaction that reads the record and checks the attempt id
(``FenceMode.TRANSACTION``), which is safe under every reading of the contract.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading

from google.cloud import ndb

log = logging.getLogger(__name__)


class FenceMode(enum.StrEnum):
    VERSION = "version"  # the database refuses stale versions: fenced writes in one round trip
    TRANSACTION = "transaction"  # it does not, or nobody checked: a transaction reads and decides


@dataclasses.dataclass(frozen=True)
class FenceCheck:
    """What the check found: the path in force, and why, in words an operator can act on.

    ``begins_in_read``: whether a transaction may be begun by its first Lookup
    (``ReadOptions.new_transaction``, one round trip saved).  The v1 API documents it; the
    Firestore emulator's commit of such a transaction times out on the lock its own read took,
    so it too is checked, and a transaction is otherwise begun by BeginTransaction."""

    mode: FenceMode
    reason: str
    begins_in_read: bool = True

    @property
    def round_trips_per_fresh_run(self) -> int:
        """A fresh run's sequential round trips (``make bench`` measures them): the claim's lookup
        and insert travel together; the finish is one fenced commit, or a transaction's read and
        commit (and its begin, where a read cannot begin it)."""
        if self.mode is FenceMode.VERSION:
            return 2
        return 3 if self.begins_in_read else 4

    def describe(self) -> str:
        return f"{self.mode} fence ({self.round_trips_per_fresh_run} round trips per fresh run): {self.reason}"


# Until the check answers: the path safe under every reading, at one round trip more.
UNCHECKED = FenceCheck(FenceMode.TRANSACTION, "the start-up check has not answered yet", begins_in_read=False)

type DatabaseId = tuple[str, str]  # (project, database): one database's check, whichever route reaches it


def database_of(client: ndb.Client) -> DatabaseId:
    return (str(client.project), str(client.database or ""))


_checks: dict[DatabaseId, FenceCheck] = {}
_checks_lock = threading.Lock()


def current(database: DatabaseId) -> FenceCheck:
    """The check that holds for ``database`` in this process (``UNCHECKED`` until one answered)."""
    return _checks.get(database, UNCHECKED)


def current_or_none(database: DatabaseId) -> FenceCheck | None:
    """The check that answered for ``database`` in this process, if one has."""
    return _checks.get(database)


def record(database: DatabaseId, check: FenceCheck) -> None:
    with _checks_lock:
        _checks[database] = check


def forget(database: DatabaseId) -> None:
    """Back to unchecked (tests that prove what each path does)."""
    with _checks_lock:
        _checks.pop(database, None)
