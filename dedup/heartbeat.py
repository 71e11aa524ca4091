"""Renew a running attempt's lease every third of the lease, each renewal one fenced write.

A job can then keep a short lease (a crashed instance is taken over within
one lease) while it runs for as long as ``max_run_seconds`` allows; past
that the renewals stop, so a hung attempt is eventually taken over.

``lease_lost()`` tells the job when it can no longer count on its lease, so
it can stop cooperatively (its completion would be refused as stale if the
run was taken over): when a renewal found the run taken over, or when the
lease it last secured has run out, because renewals stopped at
``max_run_seconds``, kept failing (Datastore unreachable), or are off
(``renew=False``: the claim's lease is the only one).

One thread per process keeps every running attempt's next renewal (``Renewals``), and a few
shared workers send them: a run starts no thread of its own (a thread per run cost about 3 ms
of CPU each), and a slow renewal of one run does not hold up the others'.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from google.cloud import ndb

from dedup.ledger import Ledger
from dedup.outcomes import Attempt, Stale

log = logging.getLogger(__name__)

# How long a finished job waits for a renewal still in flight.
EXIT_WAIT_SECONDS = 5.0
# The renewals a process sends at once: each is one round trip, a third of a lease apart per run.
RENEWAL_WORKERS = 4


class Renewals:
    """Every running attempt's next renewal in this process, in time order, and one thread that
    hands each to the shared workers when it falls due.  Started on first use, and again in a
    forked worker (gunicorn's), since threads do not survive a fork."""

    def __init__(self, workers: int = RENEWAL_WORKERS, name: str = "lease-renewal") -> None:
        """``name``: its threads' (``name`` for the workers, ``names`` for the scheduler); the
        process's own queue's are what ``threads()`` counts."""
        self._workers = workers
        self._name = name
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, LeaseHeartbeat]] = []
        self._order = itertools.count()  # ties in time go first come, first served
        self._pid: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None

    def schedule(self, beat: LeaseHeartbeat, at: float) -> None:
        with self._lock:
            self._start_here()
            if beat.stopped:  # its run finished while its last renewal was in flight
                return
            heapq.heappush(self._due, (at, next(self._order), beat))
            self._lock.notify()

    def cancel(self, beat: LeaseHeartbeat) -> None:
        """Forget ``beat``'s next renewal: a finished run's heartbeat (its attempt, its ledger)
        must not stay referenced for the rest of a third of its lease, or a worker's memory
        grows with its run rate (7.5 KiB a run; hours with long leases).  The queue holds one
        entry per running attempt of this process, so the scan is short."""
        with self._lock:
            kept = [entry for entry in self._due if entry[2] is not beat]
            if len(kept) < len(self._due):
                heapq.heapify(kept)
                self._due = kept
                self._lock.notify()

    def pending(self) -> int:
        """The renewals waiting in this process: one per running attempt that renews."""
        with self._lock:
            return len(self._due) if self._pid == os.getpid() else 0

    @staticmethod
    def threads() -> int:
        """The threads renewing leases in this process: the scheduler and the workers started so far."""
        return sum(1 for thread in threading.enumerate() if thread.name.startswith("lease-renewal"))

    def _start_here(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid, self._due = os.getpid(), []
        self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name)
        self._thread = threading.Thread(target=self._run, name=f"{self._name}s", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    # Woken by each schedule and cancel; a wait no longer than an hour, since the
                    # platform's clock refuses a timeout past its range (a lease of years).
                    self._lock.wait(timeout=min(self._due[0][0] - time.monotonic(), 3600) if self._due else None)
                _, _, beat = heapq.heappop(self._due)
                pool = self._pool
            if not beat.stopped and pool is not None:
                pool.submit(beat.renew_once)
            del beat  # the loop waits next with no run's heartbeat in hand


RENEWALS = Renewals()


class LeaseHeartbeat:
    def __init__(
        self,
        ledger: Ledger,
        attempt: Attempt,
        lease_seconds: float,
        max_run_seconds: float | None,
        renew: bool = True,
        claim_began: float | None = None,
        renewals: Renewals = RENEWALS,
    ) -> None:
        """``claim_began``: ``time.monotonic()`` taken before the claim was sent (default: now)."""
        self.ledger = ledger
        self.attempt = attempt
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        started = time.monotonic() if claim_began is None else claim_began
        self.stop_at = started + (max_run_seconds if max_run_seconds else float("inf"))
        # When the lease this attempt last secured ends (monotonic).  Counted
        # from before each request (the claim's, then each renewal's), so never
        # later than the stored lease (as far as the hosts' clocks agree).
        self._lease_ends = started + lease_seconds
        self._taken_over = threading.Event()
        self._stopped = threading.Event()
        self._idle = threading.Event()  # no renewal of this attempt in flight
        self._idle.set()
        self._renew = renew
        self._renewals = renewals
        self.renewed = 0  # renewals that landed
        # The renewals need an NDB context of their own, from the same client.
        self._client = ndb.get_context().client if renew else None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def lease_lost(self) -> bool:
        """True once the run was found taken over, or the last secured lease has run out."""
        return self._taken_over.is_set() or time.monotonic() >= self._lease_ends

    def wait_until_taken_over(self, timeout: float) -> bool:
        return self._taken_over.wait(timeout)

    def __enter__(self) -> LeaseHeartbeat:
        if self._renew:
            self._renewals.schedule(self, time.monotonic() + self.interval)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._renew:
            self._renewals.cancel(self)
        # Wait briefly for a renewal in flight, no longer: one that lands after the run
        # finished is fenced out (the record is no longer in progress), and the job's
        # outcome should not wait on Datastore.
        self._idle.wait(timeout=min(self.interval, EXIT_WAIT_SECONDS))

    def renew_once(self) -> None:
        """One renewal (on a shared worker), and the next one scheduled unless this one ends them."""
        assert self._client is not None, "scheduled only to renew"
        self._idle.clear()
        try:
            again = self._renew_in_context()
        finally:
            self._idle.set()
        if again and not self.stopped:
            self._renewals.schedule(self, time.monotonic() + self.interval)

    def _renew_in_context(self) -> bool:
        """Whether renewals go on."""
        assert self._client is not None
        began = time.monotonic()
        if began >= self.stop_at:
            log.warning(
                "run %s attempt %d: max_run_seconds reached; no more lease renewals",
                self.attempt.run_id,
                self.attempt.number,
            )
            return False
        # The last renewal ends the lease at max_run_seconds, not a lease later.
        lease = min(self.lease_seconds, self.stop_at - began)
        try:
            with self._client.context():
                outcome = self.ledger.renew_lease(self.attempt, lease, patience_seconds=self.interval)
        except Exception as exc:  # a failed renewal is retried at the next beat
            log.warning("run %s: lease renewal failed (%r); trying again", self.attempt.run_id, exc)
            return True
        if isinstance(outcome, Stale):
            if self.stopped:
                return False  # the job finished first: its own finish ended the lease
            self._taken_over.set()
            log.warning(
                "run %s attempt %d: lease lost to attempt %s; the job should stop",
                self.attempt.run_id,
                self.attempt.number,
                outcome.current.attempt if outcome.current else "none",
            )
            return False
        self._lease_ends = began + lease
        self.renewed += 1
        return True
