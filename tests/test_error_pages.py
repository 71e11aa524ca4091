"""Issue 25 §6: browsers get an HTML page for an error, API clients keep the RFC 9457 JSON.

Chosen by content negotiation on Accept, with ``Vary: Accept`` on both; the page says what
the problem says (escaped), and an unknown job is a 404, not an empty dashboard.
"""

from __future__ import annotations

import pytest

from tests.support.callers import VIEWER, app_with, as_person, iap, iap_environ  # noqa: F401 (iap: a fixture)
from tests.support.deliveries import JOBS

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
NOT_A_BROWSER = [None, "*/*", "application/json", "application/problem+json", "text/html;q=0.5, application/json"]


@pytest.fixture
def client(make_client):
    return make_client(JOBS)


# (path, status, words of the detail) for the errors a person meets at the dashboard.
ERRORS = [
    ("/admin/?status=done", 400, "unknown status or source"),
    ("/admin/?job=no-such-job", 404, "jobs.yaml has no job 'no-such-job'"),
    ("/admin/runs/" + "a" * 64, 404, "no run"),
    ("/admin/no-such-page", 404, "The requested URL was not found"),
    ("/api/v1/runs/not-a-run-id", 404, ""),
]


@pytest.mark.parametrize("path, status, words", ERRORS)
def test_a_browser_gets_a_page_saying_what_the_problem_says(client, path, status, words):
    page = client.get(path, headers={"Accept": BROWSER}, status=status)
    assert page.content_type == "text/html" and "Accept" in page.headers["Vary"]
    problem = client.get(path, status=status).json  # the same error, as JSON
    html = page.text
    assert page.html.find("h1").text.startswith(problem["title"]) and str(status) in page.html.find("h1").text
    assert page.html.find(id="problem-detail").text == problem["detail"] and words in problem["detail"]
    assert '<meta name="viewport"' in html


@pytest.mark.parametrize("accept", NOT_A_BROWSER)
@pytest.mark.parametrize("path, status, words", ERRORS[:3])
def test_every_other_client_keeps_the_json(client, path, status, words, accept):
    headers = {"Accept": accept} if accept else {}
    answer = client.get(path, headers=headers, status=status)
    assert answer.content_type == "application/problem+json" and "Accept" in answer.headers["Vary"]
    assert answer.json["status"] == status


def test_a_detail_is_escaped_in_the_page(client):
    page = client.get("/admin/", params={"job": "<script>x</script>"}, headers={"Accept": BROWSER}, status=404)
    assert "<script>x</script>" not in page.text and "&lt;script&gt;x&lt;/script&gt;" in page.text


def test_401_and_403_pages_say_what_to_do_and_keep_the_challenge(datastore, ndb_client, jobs_file, clock, iap):
    site = app_with(iap_environ(iap), datastore, ndb_client, jobs_file, clock)
    unknown = site.get("/admin/", headers={"Accept": BROWSER}, status=401)
    assert unknown.content_type == "text/html" and unknown.html.find(id="sign-in") is not None
    assert unknown.headers["WWW-Authenticate"] == 'Bearer realm="dedup"'
    viewer = {**as_person(iap, VIEWER), "Accept": BROWSER}
    site.get("/admin/", headers=viewer, status=200)  # a viewer may look
    refused = site.post("/admin/jobs/invoice/run", {"parameters": "{}"}, headers=viewer, status=403)
    assert refused.content_type == "text/html" and refused.html.find(id="ask") is not None


@pytest.mark.parametrize("accept", NOT_A_BROWSER)
def test_a_refused_delivery_is_json_as_scheduler_asks(client, accept):
    headers = {"Accept": accept} if accept else {}
    answer = client.post("/jobs/invoice", headers=headers, status=400)  # no Scheduler headers
    assert answer.content_type == "application/problem+json"


@pytest.fixture
def app_with_views(datastore, ndb_client, jobs_file, clock):
    """The app, plus two views that answer problem+json of their own making."""
    import webtest
    from flask import Response, request

    from handlers import create_app
    from handlers.problems import MEDIA_TYPE, problem

    app = create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client)

    def kept_answer():  # a guarded endpoint's stored answer: problem+json, but not a problem of ours
        body = request.args["body"]
        return Response(body, status=422, mimetype=MEDIA_TYPE, headers={"Idempotent-Replayed": "true"})

    def refused_run():
        answer = problem(409, "RunInProgress", "another attempt holds the lease")
        answer.headers.update({"Idempotency-Key": '"k-1"', "X-Dedup-Run-Id": "r" * 64, "Retry-After": "7"})
        return answer

    app.add_url_rule("/test/kept-answer", view_func=kept_answer)
    app.add_url_rule("/test/refused-run", view_func=refused_run)
    return webtest.TestApp(app)


@pytest.mark.parametrize(
    "body", ['["not", "a", "problem"]', '{"title": "no type"}', '{"type": 7}', "not json", '"a string"', "null", ""]
)
def test_a_views_own_problem_json_that_is_not_a_problem_document_goes_out_as_it_is(app_with_views, body):
    answer = app_with_views.get("/test/kept-answer", params={"body": body}, headers={"Accept": BROWSER}, status=422)
    assert answer.content_type == "application/problem+json" and answer.text == body
    assert answer.headers["Idempotent-Replayed"] == "true"


def test_a_problem_page_keeps_every_header_the_problem_had(app_with_views):
    page = app_with_views.get("/test/refused-run", headers={"Accept": BROWSER}, status=409)
    assert page.content_type == "text/html" and page.html.find(id="problem-detail").text.startswith("another")
    assert page.headers["Idempotency-Key"] == '"k-1"' and page.headers["X-Dedup-Run-Id"] == "r" * 64
    assert page.headers["Retry-After"] == "7" and "Accept" in page.headers["Vary"]
    assert page.headers.getall("Content-Type") == ["text/html; charset=utf-8"]
