"""Renew a running attempt's lease every third of the lease, in fenced transactions.

A job can then keep a short lease (a crashed instance is taken over within
one lease) while it runs for as long as ``max_run_seconds`` allows; past
that the renewals stop, so a hung attempt is eventually taken over.

``lease_lost()`` tells the job when it can no longer count on its lease, so
it can stop cooperatively (its completion would be refused as stale if the
run was taken over): when a renewal found the run taken over, or when the
lease it last secured has run out, because renewals stopped at
``max_run_seconds``, kept failing (Datastore unreachable), or are off
(``renew=False``: the claim's lease is the only one).
"""

from __future__ import annotations

import logging
import threading
import time

from google.cloud import ndb

from dedup.ledger import Ledger
from dedup.outcomes import Attempt, Stale

log = logging.getLogger(__name__)

# How long a finished job waits for a renewal still in flight.
EXIT_WAIT_SECONDS = 5.0


class LeaseHeartbeat:
    def __init__(
        self,
        ledger: Ledger,
        attempt: Attempt,
        lease_seconds: float,
        max_run_seconds: float | None,
        renew: bool = True,
        claim_began: float | None = None,
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
        self._renew = renew
        # The thread needs an NDB context of its own, from the same client.
        self._client = ndb.get_context().client if renew else None
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{attempt.run_id[:8]}", daemon=True)

    def lease_lost(self) -> bool:
        """True once the run was found taken over, or the last secured lease has run out."""
        return self._taken_over.is_set() or time.monotonic() >= self._lease_ends

    def wait_until_taken_over(self, timeout: float) -> bool:
        return self._taken_over.wait(timeout)

    def __enter__(self) -> LeaseHeartbeat:
        if self._renew:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            # Wait briefly for a renewal in flight, no longer: one that lands
            # after the run finished is fenced out (the record is no longer in
            # progress), and the job's outcome should not wait on Datastore.
            self._thread.join(timeout=min(self.interval, EXIT_WAIT_SECONDS))

    def _beat(self) -> None:
        assert self._client is not None, "the thread is started only to renew"
        with self._client.context():
            while not self._stopped.wait(self.interval):
                began = time.monotonic()
                if began >= self.stop_at:
                    log.warning(
                        "run %s attempt %d: max_run_seconds reached; no more lease renewals",
                        self.attempt.run_id,
                        self.attempt.number,
                    )
                    return
                # The last renewal ends the lease at max_run_seconds, not a lease later.
                lease = min(self.lease_seconds, self.stop_at - began)
                try:
                    outcome = self.ledger.renew_lease(self.attempt, lease, patience_seconds=self.interval)
                except Exception as exc:  # a failed renewal is retried at the next beat
                    log.warning("run %s: lease renewal failed (%r); trying again", self.attempt.run_id, exc)
                    continue
                if isinstance(outcome, Stale):
                    if self._stopped.is_set():
                        return  # the job finished first: its own finish ended the lease
                    self._taken_over.set()
                    log.warning(
                        "run %s attempt %d: lease lost to attempt %s; the job should stop",
                        self.attempt.run_id,
                        self.attempt.number,
                        outcome.current.attempt if outcome.current else "none",
                    )
                    return
                self._lease_ends = began + lease
