"""Renew a running attempt's lease every third of the lease, in fenced transactions.

A job can then keep a short lease (a crashed instance is taken over within
one lease) while it runs for as long as ``max_run_seconds`` allows; past
that the renewals stop, so a hung attempt is eventually taken over.  When a
renewal finds the run taken over, the attempt is told (``lost``) so the job
can stop cooperatively; its completion will be refused as stale anyway.
"""

from __future__ import annotations

import logging
import threading
import time

from google.cloud import ndb

from dedup.outcomes import Attempt, Stale

log = logging.getLogger(__name__)


class LeaseHeartbeat:
    def __init__(self, ledger, attempt: Attempt, lease_seconds: float, max_run_seconds: float | None) -> None:
        self.ledger = ledger
        self.attempt = attempt
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        self.stop_at = time.monotonic() + (max_run_seconds if max_run_seconds else float("inf"))
        self.lost = threading.Event()
        self._stopped = threading.Event()
        # The thread needs an NDB context of its own, from the same client.
        self._client = ndb.get_context().client
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{attempt.run_id[:8]}", daemon=True)

    def __enter__(self) -> "LeaseHeartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        with self._client.context():
            while not self._stopped.wait(self.interval):
                if time.monotonic() >= self.stop_at:
                    log.warning("run %s attempt %d: max_run_seconds reached; no more lease renewals",
                                self.attempt.run_id, self.attempt.attempt)
                    return
                # The last renewal ends the lease at max_run_seconds, not a lease later.
                lease = min(self.lease_seconds, self.stop_at - time.monotonic())
                try:
                    outcome = self.ledger.renew_lease(self.attempt, lease, patience_seconds=self.interval)
                except Exception as exc:  # noqa: BLE001 - a failed renewal is retried at the next beat
                    log.warning("run %s: lease renewal failed (%r); trying again", self.attempt.run_id, exc)
                    continue
                if isinstance(outcome, Stale):
                    self.lost.set()
                    log.warning("run %s attempt %d: lease lost to attempt %s; the job should stop",
                                self.attempt.run_id, self.attempt.attempt,
                                outcome.current.attempt if outcome.current else "none")
                    return
