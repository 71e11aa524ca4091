"""Work dispatched, not done inside the request that asks for it.

Catching up on a paused Scheduler job's slots (and, later, the dashboard's actions) must
not run jobs inside one request: a cron request has a deadline, and a browser would wait
for every job.  Each piece of ``Work`` is a request to one of this app's own endpoints,
made later by a queue, under a task id derived from the run it is for: a queue refuses an
id it has seen, and a task delivered twice still reaches the ledger under the run's key,
so it is one run either way.

An ``external`` job's slot runs are the exception: its handler is served elsewhere with the
library, so its ``Work`` is an HTTP request to that handler (``HttpTarget``: a Cloud Tasks HTTP
task with an OIDC token), carrying the slot's Scheduler headers.

``Dispatcher`` is the one interface; ``dispatch.cloud_tasks`` is production's (Cloud Tasks,
App Engine and HTTP targets), ``dispatch.in_process`` is ``make run``'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Protocol

MAX_TASK_ID = 500  # Cloud Tasks: letters, digits, hyphens and underscores, at most 500


@dataclasses.dataclass(frozen=True)
class HttpTarget:
    """A request to a handler served elsewhere: ``method`` ``url`` with ``headers`` and ``body``,
    and an OIDC token ``service_account`` signs for ``audience`` (Cloud Tasks mints it)."""

    url: str
    method: str
    headers: dict[str, str]
    body: bytes
    service_account: str
    audience: str
    deadline_seconds: float = 600  # how long the task waits for the handler's answer (Cloud Tasks: 15 s to 30 min)


@dataclasses.dataclass(frozen=True)
class Work:
    """A request this app makes of itself: POST ``relative_uri`` with the JSON ``body``; or, with
    ``http``, the request ``http`` describes, to a handler elsewhere (``relative_uri`` and ``body``
    then only describe it, for logs and tests)."""

    task_id: str
    relative_uri: str
    body: dict[str, Any]
    http: HttpTarget | None = None
    # Not before this many seconds from now: a catch-up's runs are spread (service.slots.spread_seconds).
    delay_seconds: float = 0


@dataclasses.dataclass(frozen=True)
class Dispatched:
    """What the queue said: taken now, or taken before under the same task id (``already``)."""

    task_id: str
    already: bool = False


class DispatchError(RuntimeError):
    """The queue could not take the work; nothing was dispatched (the same call may be made again)."""


class Dispatcher(Protocol):
    def dispatch(self, work: Work) -> Dispatched: ...


def task_id(kind: str, *parts: str) -> str:
    """A task id for ``kind`` of work on ``parts`` (a run id, an attempt): hashed, as Cloud Tasks advises
    (sequential names are slow), so the same work always gets the same id."""
    digest = hashlib.sha256("\x1f".join((kind, *parts)).encode("utf-8")).hexdigest()
    return f"{kind}-{digest[:48]}"
