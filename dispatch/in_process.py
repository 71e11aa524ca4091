"""``make run``'s dispatcher: the work done by this process, on a thread, through the app itself.

Each piece of work is a request to the app's own endpoint (as Cloud Tasks would make it),
so it goes through caller verification and the ledger exactly as a task does; a task id
seen before is refused, as a queue refuses it.  An answer a retry may cure (409 while another
attempt holds the run or the job, 500 for a released run) is retried as queue.yaml's
``retry_parameters`` bound Cloud Tasks: the same backoff, the same limits.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import functools
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import requests

from dedup.clock import Clock, SystemClock
from dedup.http_status import is_retryable_status
from dispatch import Dispatched, HttpTarget, Work
from jobs.config import load_strict_yaml
from jobs.trace_headers import outgoing_trace_headers, traced
from schedules.config import backoff_seconds

log = logging.getLogger(__name__)
QUEUE_NAME = "in-process"
QUEUE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "queue.yaml")
DISPATCH_QUEUE = "dedup-dispatch"  # app.yaml's DEDUP_TASKS_QUEUE: the queue whose retries this one plays
# What App Engine takes for a retry parameter queue.yaml leaves out (queue.yaml's reference).
DEFAULT_MIN_BACKOFF_SECONDS = 0.1
DEFAULT_MAX_BACKOFF_SECONDS = 3600.0
DEFAULT_MAX_DOUBLINGS = 16
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
AGE_LIMIT = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


@dataclasses.dataclass(frozen=True)
class RetryParameters:
    """A queue's retry_parameters: how long to wait before each retry, and when to stop.

    Cloud Tasks stops only once both limits are reached (a limit left out is reached at once;
    neither given: it retries for ever).  The wait starts at ``min_backoff``, doubles
    ``max_doublings`` times, then grows by that last step each retry, up to ``max_backoff``."""

    task_retry_limit: int | None = None
    task_age_limit: float | None = None  # seconds since the first attempt
    min_backoff: float = DEFAULT_MIN_BACKOFF_SECONDS
    max_backoff: float = DEFAULT_MAX_BACKOFF_SECONDS
    max_doublings: int = DEFAULT_MAX_DOUBLINGS

    @classmethod
    @functools.cache
    def of_queue(cls, path: str = QUEUE_FILE, name: str = DISPATCH_QUEUE) -> RetryParameters:
        """Queue ``name``'s retry_parameters in the queue.yaml at ``path``.

        Read once a process (the file is deployed with the code, and every app build asks):
        parsing it cost each build about 1 ms with libyaml, 10 ms without."""
        with open(path, encoding="utf-8") as handle:
            queues = load_strict_yaml(handle)["queue"]
        [queue] = [queue for queue in queues if queue["name"] == name]
        given = queue.get("retry_parameters") or {}
        age = given.get("task_age_limit")
        return cls(
            task_retry_limit=given.get("task_retry_limit"),
            task_age_limit=None if age is None else _age_seconds(str(age)),
            min_backoff=float(given.get("min_backoff_seconds", DEFAULT_MIN_BACKOFF_SECONDS)),
            max_backoff=float(given.get("max_backoff_seconds", DEFAULT_MAX_BACKOFF_SECONDS)),
            max_doublings=int(given.get("max_doublings", DEFAULT_MAX_DOUBLINGS)),
        )

    def backoff(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the first)."""
        return backoff_seconds(self.min_backoff, self.max_backoff, self.max_doublings, retry - 1)

    def gives_up(self, retries: int, age: datetime.timedelta) -> bool:
        """Whether a task retried ``retries`` times, first tried ``age`` ago, is not retried again."""
        if self.task_retry_limit is None and self.task_age_limit is None:
            return False
        retried_enough = self.task_retry_limit is None or retries >= self.task_retry_limit
        old_enough = self.task_age_limit is None or age.total_seconds() >= self.task_age_limit
        return retried_enough and old_enough


def _age_seconds(text: str) -> float:
    """queue.yaml's task_age_limit (a number and a unit: s, m, h or d) in seconds."""
    match = AGE_LIMIT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"task_age_limit {text!r} is not a number and a unit (s, m, h or d)")
    return float(match[1]) * AGE_UNITS[match[2]]


class InProcessDispatcher:
    """Work done on this process's threads, through ``app`` (a WSGI app with Flask's test client).

    ``retry``: the queue's retry parameters (queue.yaml's by default).  ``clock`` and ``sleep``:
    the time a retry waits by, which tests replace.  A task waiting for its retry holds no
    worker: it waits on a thread of its own, as a queue holds a task apart until it is due."""

    def __init__(
        self,
        workers: int = 2,
        retry: RetryParameters | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="dispatch")
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.app: Any = None  # set by create_app once the app exists
        self.futures: list[concurrent.futures.Future[int]] = []
        self.retry = retry or RetryParameters.of_queue()
        self.clock: Clock = clock or SystemClock()
        self.sleep = sleep

    def dispatch(self, work: Work) -> Dispatched:
        with self._lock:
            if work.task_id in self._seen:
                return Dispatched(work.task_id, already=True)
            self._seen.add(work.task_id)
            settled: concurrent.futures.Future[int] = concurrent.futures.Future()
            self.futures.append(settled)
        # The task carries the dispatching request's trace, as a Cloud Tasks task does.
        self._pool.submit(self._attempt, work, 0, self.clock.now(), settled, outgoing_trace_headers())
        return Dispatched(work.task_id)

    def _attempt(
        self,
        work: Work,
        retries: int,
        first: datetime.datetime,
        settled: concurrent.futures.Future[int],
        trace: dict[str, str],
    ) -> None:
        """One delivery of ``work``; an answer a retry may cure is retried after the queue's backoff."""
        try:
            status = self._deliver(work, retries, trace)
        except BaseException as exc:
            settled.set_exception(exc)
            return
        if 200 <= status < 300:
            settled.set_result(status)
            return
        if not is_retryable_status(status) or self.retry.gives_up(retries, self.clock.now() - first):
            log.warning("dispatched task %s answered %s after %d retries: not retried", work.task_id, status, retries)
            settled.set_result(status)
            return
        wait = self.retry.backoff(retries + 1)
        log.info("dispatched task %s answered %s: retried in %gs", work.task_id, status, wait)

        def later() -> None:
            self.sleep(wait)
            try:
                self._pool.submit(self._attempt, work, retries + 1, first, settled, trace)
            except RuntimeError:  # the pool shut down meanwhile: the process is exiting
                log.warning("dispatched task %s answered %s: not retried, the process is exiting", work.task_id, status)
                settled.set_result(status)

        threading.Thread(target=later, name=f"dispatch-retry-{work.task_id[:24]}", daemon=True).start()

    def _deliver(self, work: Work, retries: int, trace: dict[str, str]) -> int:
        if work.http is not None:
            return deliver_http(work.http, work.task_id, retries, trace)
        response = self.app.test_client().post(
            work.relative_uri,
            data=json.dumps(work.body),
            headers={
                **trace,
                "Content-Type": "application/json",
                "X-AppEngine-QueueName": QUEUE_NAME,
                "X-AppEngine-TaskName": work.task_id,
                "X-AppEngine-TaskRetryCount": str(retries),
            },
        )
        return int(response.status_code)

    def wait(self, timeout: float | None = None) -> list[int]:
        """Every status the work dispatched so far settled with, retries included (tests, make run's shutdown)."""
        with self._lock:
            futures = list(self.futures)
        return [future.result(timeout) for future in futures]


HTTP_TASK_TIMEOUT_SECONDS = 600  # Cloud Tasks' default dispatch deadline for an HTTP task


def deliver_http(target: HttpTarget, task_id: str, retries: int, trace: dict[str, str] | None = None) -> int:
    """An HTTP task as Cloud Tasks sends one (its X-CloudTasks-* headers), without the OIDC token
    it would mint: locally, the handler is served without caller verification.  A request that
    gets no answer is a 503 to the queue, retried as Cloud Tasks retries it."""
    headers = {
        **traced(target.headers, trace or {}),
        "X-CloudTasks-QueueName": QUEUE_NAME,
        "X-CloudTasks-TaskName": task_id,
        "X-CloudTasks-TaskRetryCount": str(retries),
    }
    try:
        response = requests.request(
            target.method, target.url, headers=headers, data=target.body, timeout=HTTP_TASK_TIMEOUT_SECONDS
        )
    except requests.RequestException as exc:
        log.warning("dispatched task %s to %s got no answer: %s", task_id, target.url, exc)
        return 503
    return int(response.status_code)
