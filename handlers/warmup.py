"""``/_ah/warmup``: App Engine's warmup request (app.yaml's ``inbound_services: warmup``).

App Engine sends it to a new instance before routing traffic there, so the first delivery
does not pay for the instance's start.  Every gunicorn worker warms itself before it serves
(gunicorn.conf.py: the schedules bound, then ``warm``: a Datastore round trip, the Cloud
Tasks client, every page template compiled); the request finds a worker that has, or warms
the one it reached if that failed, and answers once it is done.

It is open to every caller (handlers/access.py ``open_to_anyone``): App Engine sends it from
0.1.0.3, an address none of the trusted markers covers, and it does nothing a caller chooses
and says nothing.  A worker warms once, whatever happened, so calling it again costs a stranger
what a 404 would; a call while a worker is warming answers at once too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator

from flask import Blueprint, Flask, current_app
from google.cloud import ndb

from dispatch.cloud_tasks import CloudTasksDispatcher
from handlers.access import open_to_anyone
from handlers.state import AppState

blueprint = Blueprint("warmup", __name__)
log = logging.getLogger(__name__)
# A run id no run has (SHA-256 hex is never all zeros): looked up for its round trip alone.
NO_RUN = "0" * 64
EXTENSION = "dedup.warmup"
_made = threading.Lock()


@dataclasses.dataclass
class Warmth:
    """One app's warming: done once, by one thread at a time."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    done: bool = False


def warm(app: Flask, ndb_client: ndb.Client | None = None) -> float | None:
    """Do the work of a worker's first request now, once per app: the milliseconds it took, or
    None when it was done before or another thread is doing it.  A failure (Datastore not reached)
    is logged and not tried again here: the first request that needs it does it then."""
    with _made:
        warmth = app.extensions.setdefault(EXTENSION, Warmth())
    if not warmth.lock.acquire(blocking=False):
        return None
    try:
        if warmth.done:
            return None
        started = time.perf_counter()
        try:
            with app.app_context(), _ndb_context(ndb_client):
                _warm(app)
        except Exception as exc:  # a worker must start, and warmup answer, regardless
            log.warning("this worker was not fully warmed (%r); its first request does the rest", exc)
        warmth.done = True
        return (time.perf_counter() - started) * 1000
    finally:
        warmth.lock.release()


@contextlib.contextmanager
def _ndb_context(client: ndb.Client | None) -> Iterator[None]:
    """The request's NDB context when there is one, else one of ``client`` (a worker before it serves)."""
    if ndb.get_context(False) is not None or client is None:
        yield
        return
    with client.context():
        yield


def _warm(app: Flask) -> None:
    state: AppState = app.extensions["dedup"]
    state.ledger.lookup(NO_RUN)
    if isinstance(state.dispatcher, CloudTasksDispatcher):
        state.dispatcher.client  # noqa: B018  (made on first use: made now)
    environment = app.jinja_env
    for name in environment.list_templates(filter_func=lambda name: name.endswith(".html")):
        environment.get_template(name)


@blueprint.get("/_ah/warmup", provide_automatic_options=False)
@open_to_anyone
def warmup() -> tuple[str, int, dict[str, str]]:
    took = warm(current_app._get_current_object())  # type: ignore[attr-defined]
    text = "warm\n" if took is None else f"warmed in {took:.0f} ms\n"
    return text, 200, {"Content-Type": "text/plain"}
