"""A guarded service for the live tests of the guard's rules (served by gunicorn: tests.guard_app:app).

Its callers say who they are in ``X-Caller`` (a stand-in for its own auth), and every
effect is a line in ``GUARD_EFFECTS_DIR``, so a test counts them across worker processes.
"""

from __future__ import annotations

import fcntl
import json
import os

from flask import Flask, request

from dedup.adapters.flask_guard import KeyFrom, idempotent, install_guard
from dedup.clock import SystemClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware, finished_cache_entries_from_environ
from handlers.errors import register

app = Flask(__name__)
# The tests wipe the Datastore between them, which production never does: the cache of
# completed runs follows DEDUP_FINISHED_CACHE_ENTRIES as the app's does (tests: 0, off).
ledger = Ledger(SystemClock(), FinishedRuns(max_entries=finished_cache_entries_from_environ(os.environ)))
install_guard(app, ledger, caller=lambda: request.headers.get("X-Caller", ""))
register(app)
app.wsgi_app = NdbContextMiddleware(app.wsgi_app)  # type: ignore[method-assign]


def effect(record: dict) -> int:
    path = os.path.join(os.environ["GUARD_EFFECTS_DIR"], "effects")
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps(record) + "\n")
        handle.seek(0)
        return len(handle.readlines())


@app.route("/orders", methods=["GET", "POST"])
@idempotent("orders")
def orders():
    if request.method == "GET":
        return {"listed": True}
    body = request.get_json()
    if "item" not in body:
        return {"error": "item is required"}, 400
    return {"order": effect({"caller": request.headers.get("X-Caller"), "item": body["item"]})}, 201


@app.post("/orders-kept")
@idempotent("orders-kept", keep_validation_errors=True, keep_server_errors=True)
def orders_kept():
    """Every answer kept, 400 and 5xx too: ``fail`` makes the view answer 500 after its effect."""
    body = request.get_json()
    if "item" not in body:
        return {"error": "item is required"}, 400
    number = effect({"caller": request.headers.get("X-Caller"), "item": body["item"]})
    if body.get("fail"):
        return {"error": "the bank is down", "order": number}, 500
    return {"order": number}, 201


@app.post("/orders-by-id")
@idempotent("orders-by-id", key=KeyFrom.field("order_id"))
def orders_by_id():
    """Keyed by the body's ``order_id``: a client's integer is its decimal string."""
    body = request.get_json()
    return {"order": effect({"caller": request.headers.get("X-Caller"), "item": body.get("item")})}, 201
