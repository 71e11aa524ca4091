"""App Engine's internal markers count only on requests with no signed-in user (issue 35 §3).

App Engine strips client-sent ``X-Appengine-*`` headers, except a signed-in admin's, who may set
them to test (a project Viewer is such an admin).  So the markers of App Engine's own requests
(cron, the task queue, its internal source IPs), which make a caller a deliverer and let a task
name who asked (``requested_by``), are refused on a request with ``X-Appengine-User-Email``:
403, a ``ForbiddenEvidence`` problem naming the marker, on every route the app has (read from
its URL map, so a new route is held to it), before anything is read or written.  Google's
nomulus did the same (PR #1030: a task queue's header is internal only with no user signed in).
"""

from __future__ import annotations

import pytest

from handlers.access import Role
from handlers.auth import APPENGINE_MARKERS, AppEngineMarkers
from handlers.auth.verifier import ForbiddenEvidence
from models import RunRecord
from tests.support.callers import (  # noqa: F401 - fixtures
    AUDIENCE,
    CALLER,
    app_with,
    iap,
    iap_environ,
    issuer,
    nothing_written,
    oidc_app,
)
from tests.support.routes import every_route, routes_needing

# Each internal marker App Engine sets on its own requests, as it sets it: the ones the app trusts
# (DEDUP_APPENGINE_TRUSTED's names) and the task's name the queue sends beside its queue's.
MARKERS = {
    "cron": {"X-Appengine-Cron": "true"},
    "queue": {"X-AppEngine-QueueName": "default"},
    "task": {"X-AppEngine-TaskName": "manual-run-0123"},
    "ip:0.1.0.2": {"X-Appengine-User-Ip": "0.1.0.2"},
    "ip:0.1.0.1": {"X-Appengine-User-Ip": "0.1.0.1"},
}
OPERATOR = "carol@example.com"
# A signed-in user as App Engine names one: an admin (an operator here, so that every route would
# admit her on her own account), and a user who is not an admin.
SIGNED_IN = {
    "admin": {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": OPERATOR},
    "non-admin": {"X-Appengine-User-Is-Admin": "0", "X-Appengine-User-Email": "dan@example.com"},
}
MODES = {
    "appengine": lambda iap: {"DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": OPERATOR},
    "appengine,iap": lambda iap: iap_environ(iap, DEDUP_OPERATORS=OPERATOR),
}
MANUAL_RUN = {"job_id": "invoice", "clientToken": "t-1", "parameters": {}, "requested_by": "user:alice@example.com"}


def test_every_trusted_internal_marker_is_in_the_class():
    """A marker added to DEDUP_APPENGINE_TRUSTED's set is tested here too (or this fails)."""
    assert set(APPENGINE_MARKERS) - {"admin"} <= set(MARKERS)


@pytest.fixture(params=list(MODES))
def marked_app(request, datastore, ndb_client, jobs_file, clock, iap):
    return app_with(MODES[request.param](iap), datastore, ndb_client, jobs_file, clock)


def body_for(method: str) -> dict[str, object]:
    """What a task would carry: a JSON body on a post, so that no route refuses it for want of one."""
    if method == "GET":
        return {}
    return {"body": b'{"job_id": "invoice"}', "content_type": "application/json"}


@pytest.mark.parametrize("user", list(SIGNED_IN))
@pytest.mark.parametrize("marker", list(MARKERS))
def test_a_signed_in_users_internal_marker_is_refused_on_every_route(marked_app, ndb_client, marker, user):
    headers = {**MARKERS[marker], **SIGNED_IN[user]}
    [(header, _)] = MARKERS[marker].items()
    wrong = []
    routes = every_route(marked_app.app) + [("/no/such/page", ["GET"])]
    for path, methods in routes:
        for method in methods:
            response = marked_app.request(path, method=method, headers=headers, expect_errors=True, **body_for(method))
            document = response.json if response.content_type == "application/problem+json" else {}
            if (
                response.status_int != 403
                or document.get("type") != "/problems/forbidden-evidence"
                or header not in document.get("detail", "")
                or "signed-in user" not in document.get("detail", "")
                or OPERATOR in response.text
            ):
                wrong.append(f"{method} {path}: {response.status} {document.get('error')} {document.get('detail')}")
    assert wrong == [], f"{len(wrong)} of the routes admit {marker} from a signed-in {user}:\n" + "\n".join(wrong)
    assert nothing_written(ndb_client)


@pytest.mark.parametrize("marker", sorted(set(APPENGINE_MARKERS) - {"admin"}))
def test_without_a_signed_in_user_each_trusted_marker_still_delivers(datastore, ndb_client, jobs_file, clock, marker):
    app = app_with({"DEDUP_AUTH": "appengine"}, datastore, ndb_client, jobs_file, clock)
    routes = routes_needing(app.app, Role.DELIVER)
    assert {path for path, _ in routes} >= {"/jobs/invoice", "/tasks/cleanup", "/tasks/manual-run", "/tasks/run-slot"}
    for path, method in routes:
        headers = {**MARKERS[marker], "X-Appengine-User-Email": ""}  # as dev_appserver sends no one
        response = app.request(path, method=method, headers=headers, expect_errors=True, **body_for(method))
        assert response.status_int != 401, (method, path, response.text)
        if response.status_int == 403:  # a task naming who asked, from a marker other than the queue's
            assert marker != "queue" and "only the task queue sends it" in response.json["detail"], (method, path)


def test_a_signed_in_viewer_cannot_start_a_run_in_an_operators_name(datastore, ndb_client, jobs_file, clock):
    """The attack of issue 35 §3: a project Viewer (an admin to App Engine) posing as the task queue."""
    environ = {"DEDUP_AUTH": "appengine", "DEDUP_OPERATORS": "alice@example.com"}
    app = app_with(environ, datastore, ndb_client, jobs_file, clock)
    viewer = {"X-Appengine-User-Is-Admin": "1", "X-Appengine-User-Email": "bob@example.com"}
    refused = app.post_json("/tasks/manual-run", MANUAL_RUN, headers={**viewer, **MARKERS["queue"]}, status=403)
    assert refused.json["error"] == "ForbiddenEvidence"
    assert refused.json["detail"].startswith("X-AppEngine-QueueName came with a signed-in user")
    assert "bob@example.com" not in refused.text  # the detail names headers, never what they hold
    assert nothing_written(ndb_client)
    # The queue itself, with no one signed in, still names who asked.
    app.post_json("/tasks/manual-run", MANUAL_RUN, headers=MARKERS["queue"], status=200)
    with ndb_client.context():
        assert [run.requested_by for run in RunRecord.query()] == ["user:alice@example.com"]


@pytest.mark.parametrize("marker", list(MARKERS))
def test_the_mode_refuses_the_marker_of_a_signed_in_user_and_names_the_caller_without_one(marker):
    mode = AppEngineMarkers()
    with pytest.raises(ForbiddenEvidence) as refused:
        mode.identify({**MARKERS[marker], **SIGNED_IN["non-admin"]})
    assert list(MARKERS[marker])[0] in refused.value.reason
    unsigned = mode.identify({**MARKERS[marker], "X-Appengine-User-Email": " "})
    if marker in APPENGINE_MARKERS:
        assert unsigned is not None and unsigned.name == f"appengine:{marker}"
    else:  # the task's name is no deliverer's evidence: it only marks the request as the queue's
        assert unsigned is None


def test_in_any_mode_a_task_names_who_asked_only_from_the_queue_with_no_one_signed_in(oidc_app, issuer, ndb_client):
    """Beside oidc (no App Engine mode to refuse the marker), a deliverer's task still cannot carry a
    signed-in user's queue marker into ``requested_by``."""
    token = {"Authorization": f"Bearer {issuer.token(audience=AUDIENCE, email=CALLER)}"}
    headers = {**token, **MARKERS["queue"], **SIGNED_IN["admin"]}
    refused = oidc_app.post_json("/tasks/manual-run", MANUAL_RUN, headers=headers, status=403)
    assert "only the task queue sends it" in refused.json["detail"]
    assert nothing_written(ndb_client)
