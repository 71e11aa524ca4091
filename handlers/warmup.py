"""``/_ah/warmup``: App Engine's warmup request (app.yaml's ``inbound_services: warmup``).

App Engine sends it to a new instance before routing traffic there, so the first delivery
does not pay for the instance's start.  gunicorn has imported the app and bound the schedules
by the time the worker answers (gunicorn.conf.py); this does the rest that the first request
would do: a Datastore round trip on the request path (the channel and the NDB context's first
use), the Cloud Tasks client, and every page template compiled.

It is open to every caller (handlers/access.py ``open_to_anyone``): App Engine sends it from
0.1.0.3, an address none of the trusted markers covers, and it does nothing a caller chooses
and says nothing.  It does its work once per worker; later calls answer at once, so calling it
costs a stranger what a 404 would.
"""

from __future__ import annotations

import threading
import time

from flask import Blueprint, current_app

from dispatch.cloud_tasks import CloudTasksDispatcher
from handlers.access import open_to_anyone
from handlers.state import app_state

blueprint = Blueprint("warmup", __name__)
# A run id no run has (SHA-256 hex is never all zeros): looked up for its round trip alone.
NO_RUN = "0" * 64
_warmed: set[int] = set()  # the apps (by id) this process has warmed
_lock = threading.Lock()


@blueprint.get("/_ah/warmup", provide_automatic_options=False)
@open_to_anyone
def warmup() -> tuple[str, int, dict[str, str]]:
    with _lock:
        if id(current_app) in _warmed:
            return "warm\n", 200, {"Content-Type": "text/plain"}
        started = time.perf_counter()
        state = app_state()
        state.ledger.lookup(NO_RUN)
        if isinstance(state.dispatcher, CloudTasksDispatcher):
            state.dispatcher.client  # noqa: B018  (made on first use: made now)
        environment = current_app.jinja_env
        for name in environment.list_templates(filter_func=lambda name: name.endswith(".html")):
            environment.get_template(name)
        _warmed.add(id(current_app))
        took = (time.perf_counter() - started) * 1000
    return f"warmed in {took:.0f} ms\n", 200, {"Content-Type": "text/plain"}
