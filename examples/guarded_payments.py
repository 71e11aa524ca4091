"""The idempotency guard on an endpoint of your own: docs/manual-runs.md shows this file.

Serve it with ``gunicorn examples.guarded_payments:app`` (DATASTORE_EMULATOR_HOST
pointing at an emulator locally).
"""

from __future__ import annotations

from flask import Flask, jsonify, request

from dedup.adapters.flask_guard import Fingerprint, idempotent, install_guard
from dedup.clock import SystemClock
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware, problem_pages
from handlers.request_limits import limit_requests

app = Flask(__name__)
install_guard(app, Ledger(SystemClock()))  # the ledger the guard's records go to
limit_requests(app)  # bodies over 1 MiB (chunked too) are 413; HEAD is 405
app.register_blueprint(problem_pages.blueprint)  # /problems/<slug>: what the guard's problems' types point to
app.wsgi_app = NdbContextMiddleware(app.wsgi_app)  # an NDB context per request
PAYMENTS: list[dict] = []  # stands in for the side effect that must happen once


def current_tenant() -> str:
    return request.headers.get("X-Tenant", "")


@app.post("/payments")
@idempotent(
    "payments",  # namespace of the keys
    fingerprint=Fingerprint.fields("amount", "currency"),  # what makes two calls the same (default: the body)
    scope=current_tenant,  # keys are per tenant
)
def create_payment():  # g.idempotency: key, key_generated, run_id, attempt, attempt_id
    payment = {"id": len(PAYMENTS) + 1, **request.get_json()}
    PAYMENTS.append(payment)
    response = jsonify(payment)
    response.headers["Location"] = f"/payments/{payment['id']}"
    return response, 201
