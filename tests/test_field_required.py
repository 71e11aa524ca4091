"""Issue 35 §3: a 400 names the field it wants, never "None".

A cron.yaml request (``X-Appengine-Cron: true``, no ``X-CloudScheduler-ScheduleTime``) to a
guarded endpoint whose key a function reads was told ``the None field is required for this
request``: ``KeyFrom.missing()`` named the header or the body field, and a function's key has
neither.  The class: a required key names where it comes from when it is declared (else a
``ValueError`` at import, as a bad namespace is), and every 400 a cron-style request can get,
from the scheduled endpoint, from a guarded one or from any route of the app, names a field and
never says "None".
"""

from __future__ import annotations

import pytest
import webtest
from flask import Flask, request

from dedup.adapters.flask_guard import KeyFrom, idempotent, install_guard
from dedup.ledger import Ledger
from handlers import NdbContextMiddleware
from handlers.errors import register as register_error_handlers
from tests.support.callers import appengine_app  # noqa: F401 - fixture
from tests.support.routes import every_route

CRON = {"X-Appengine-Cron": "true"}  # what cron.yaml's requests carry: no Scheduler headers at all


def schedule_time() -> str | None:
    return request.headers.get("X-CloudScheduler-ScheduleTime")


def slot_of_body() -> str | None:
    return (request.get_json(silent=True) or {}).get("slot")


@pytest.fixture
def guarded(datastore, ndb_client, clock):
    """A service whose endpoints a cron job might call: keyed by the header, a body field, both,
    or the Scheduler's schedule time as a function reads it."""
    app = Flask("guarded")
    install_guard(app, Ledger(clock))
    register_error_handlers(app)
    keys = {
        "header": KeyFrom.header(),
        "field": KeyFrom.field("requestId"),
        "field-or-header": KeyFrom.field("requestId", header="Idempotency-Key"),
        "function": KeyFrom.function(schedule_time, header="X-CloudScheduler-ScheduleTime"),
        "function-of-the-body": KeyFrom.function(
            lambda: (request.get_json(silent=True) or {}).get("slot"), field="slot"
        ),
    }
    for name, key in keys.items():
        app.add_url_rule(f"/{name}", name, idempotent(name, key=key)(lambda: {"ran": True}), methods=["POST"])
    app.wsgi_app = NdbContextMiddleware(app.wsgi_app, ndb_client)  # type: ignore[method-assign]
    return webtest.TestApp(app)


@pytest.mark.parametrize(
    "path, wanted",
    [
        ("/header", "the Idempotency-Key header"),
        ("/field", "the requestId field"),
        ("/field-or-header", "the requestId field or the Idempotency-Key header"),
        ("/function", "the X-CloudScheduler-ScheduleTime header"),
        ("/function-of-the-body", "the slot field"),
    ],
)
def test_a_cron_request_to_a_guarded_endpoint_is_told_the_field_it_lacks(guarded, path, wanted):
    refused = guarded.post_json(path, {}, headers=CRON, status=400).json
    assert refused["detail"] == f"{wanted} is required for this request"
    assert refused["field"] == wanted.split()[1]
    assert "None" not in refused["detail"]


@pytest.mark.parametrize(
    "declare",
    [
        lambda: KeyFrom.function(schedule_time),
        lambda: KeyFrom(header_name=None),
        lambda: KeyFrom.header(None),  # type: ignore[arg-type]
        lambda: KeyFrom.field(None),  # type: ignore[arg-type]
    ],
)
def test_a_required_key_that_names_no_field_is_refused_when_declared(declare):
    with pytest.raises(ValueError, match="names no header or body field"):
        declare()


def test_a_key_that_is_never_asked_for_need_not_name_a_field():
    KeyFrom.function(schedule_time, required=False)  # no key: the view runs unguarded
    KeyFrom.function(schedule_time, generate=True)  # no key: a fresh one


@pytest.mark.parametrize(
    "headers, field",
    [
        (CRON, "X-CloudScheduler-JobName"),
        ({**CRON, "X-CloudScheduler-JobName": "invoice"}, "X-CloudScheduler-ScheduleTime"),
        ({"X-AppEngine-QueueName": "__cron"}, "X-CloudScheduler-JobName"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_cron_request_to_the_scheduled_endpoint_is_told_the_header_it_lacks(appengine_app, headers, field, method):
    refused = appengine_app.request("/jobs/invoice", method=method, headers=headers, status=400).json
    assert refused["field"] == field
    assert f"missing {field} header" in refused["detail"] and "None" not in refused["detail"]


def test_no_route_tells_a_cron_request_none(appengine_app):
    """Every route of the app, as cron.yaml would call it: whatever it answers says no "None"."""
    for path, methods in every_route(appengine_app.app):
        for method in methods:
            answer = appengine_app.request(path, method=method, headers=CRON, status="*")
            assert answer.status_int < 500, f"{method} {path}: {answer.status}"
            if answer.status_int >= 400 and answer.content_type == "application/problem+json":
                assert "None" not in answer.json["detail"], f"{method} {path}: {answer.json['detail']}"
