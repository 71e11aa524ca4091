"""``make run``'s dispatcher: the work done by this process, on a thread, through the app itself.

Each piece of work is a request to the app's own endpoint (as Cloud Tasks would make it),
so it goes through caller verification and the ledger exactly as a task does; a task id
seen before is refused, as a queue refuses it.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from typing import Any

from dispatch import Dispatched, Work

log = logging.getLogger(__name__)
QUEUE_NAME = "in-process"


class InProcessDispatcher:
    """Work done on this process's threads, through ``app`` (a WSGI app with Flask's test client)."""

    def __init__(self, workers: int = 2) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="dispatch")
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.app: Any = None  # set by create_app once the app exists
        self.futures: list[concurrent.futures.Future[int]] = []

    def dispatch(self, work: Work) -> Dispatched:
        with self._lock:
            if work.task_id in self._seen:
                return Dispatched(work.task_id, already=True)
            self._seen.add(work.task_id)
            self.futures.append(self._pool.submit(self._deliver, work))
        return Dispatched(work.task_id)

    def _deliver(self, work: Work) -> int:
        response = self.app.test_client().post(
            work.relative_uri,
            data=json.dumps(work.body),
            headers={
                "Content-Type": "application/json",
                "X-AppEngine-QueueName": QUEUE_NAME,
                "X-AppEngine-TaskName": work.task_id,
            },
        )
        if response.status_code >= 300:
            log.warning("dispatched task %s answered %s", work.task_id, response.status_code)
        return int(response.status_code)

    def wait(self, timeout: float | None = None) -> list[int]:
        """Every status the work dispatched so far answered (tests, make run's shutdown)."""
        with self._lock:
            futures = list(self.futures)
        return [future.result(timeout) for future in futures]
