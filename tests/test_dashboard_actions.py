"""The dashboard's actions: Run now and Retry, for operators only, one run per rendered form.

Each is confirmed on a page of its own (naming the job and what it calls downstream), then
queued (the app's in-process queue here, Cloud Tasks in production): the answer is the run's
page at once, saying it is queued, then started.

Behind ``appengine,iap`` as shipped for people: the operator and the viewer are IAP
identities (tests.support.callers).  The browser test (tests/test_dashboard.py)
drives the same forms in chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import threading

import pytest
from werkzeug.serving import make_server

from models import RunRecord
from tests import job_targets
from tests.support import POLL_SECONDS
from tests.support.callers import (  # noqa: F401 - fixtures
    OPERATOR,
    VIEWER,
    as_person,
    iap,
    iap_app,
    nothing_written,
    settle,
    without_retries,
)
from tests.support.manual_runs import start

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
TOKEN = re.compile(r'name="clientToken" value="([^"]+)"')


def operator(iap):
    return {**as_person(iap, OPERATOR), **SAME_ORIGIN}


def viewer(iap):
    return {**as_person(iap, VIEWER), **SAME_ORIGIN}


def confirm_token(app, headers, job_id: str) -> str:
    """The client token of Run now's confirmation form, as the page rendered it."""
    page = app.get(f"/admin/jobs/{job_id}/run", headers=headers, status=303)  # a token is put in the link
    assert "token=" in page.headers["Location"]
    return TOKEN.search(page.follow(headers=headers).text).group(1)


def run_now(app, headers, job="invoice", status=303, **fields):
    return app.post(f"/admin/jobs/{job}/run", fields, headers=headers, status=status)


def path(response) -> str:
    """Where a dashboard action sent the browser, without what it says it did (``?answer=``)."""
    return response.headers["Location"].split("?")[0]


def run_id_of(response) -> str:
    return response.headers["Location"].split("?")[0].rsplit("/", 1)[1]


def records(ndb_client):
    with ndb_client.context():
        return RunRecord.query().fetch()


def test_operators_confirm_each_run_on_a_page_naming_the_job_and_its_downstream(iap_app, iap):
    page = iap_app.get("/admin/", headers=operator(iap))
    links = page.html.select("a.run-now")
    assert len(links) == len(iap_app.app.extensions["dedup"].jobs) and "clientToken" not in page.text
    confirm = iap_app.get(links[0]["href"], headers=operator(iap)).html
    job_id = links[0]["href"].split("/")[-2]
    assert confirm.find(id="confirm-title").text == f"Run {job_id} now?"
    calls = iap_app.app.extensions["dedup"].jobs[job_id].runner.calls()
    assert confirm.find(id="calls").text == calls and confirm.find(id="cancel") is not None
    # Each render of the dashboard links a form of its own; the confirmation keeps the link's
    # token, so going back to it (a browser may fetch it anew) and sending it again is one run.
    renders = [iap_app.get("/admin/", headers=operator(iap)).html.select_one("a.run-now")["href"] for _ in range(3)]
    assert len(set(renders)) == 3
    token = renders[0].split("token=")[1]
    assert [TOKEN.search(iap_app.get(renders[0], headers=operator(iap)).text).group(1) for _ in range(2)] == [token] * 2
    assert confirm_token(iap_app, operator(iap), "invoice") != confirm_token(iap_app, operator(iap), "invoice")
    bad = iap_app.get("/admin/jobs/invoice/run", params={"token": "x" * 65}, headers=operator(iap), status=400)
    assert "reload the dashboard" in bad.text
    iap_app.get("/admin/jobs/invoice/run", headers=viewer(iap), status=403)  # viewers cannot start one
    iap_app.get("/admin/jobs/nope/run", headers=operator(iap), status=404)


def test_viewers_see_no_buttons(iap_app, iap, ndb_client):
    page = iap_app.get("/admin/", headers=viewer(iap))
    assert "Run now" not in page.text and "clientToken" not in page.text


def test_run_now_is_queued_and_runs_once_however_often_the_form_is_sent(iap_app, iap, ndb_client):
    token = confirm_token(iap_app, operator(iap), "values")
    fields = {"clientToken": token, "parameters": '{"value": 7}'}
    first = run_now(iap_app, operator(iap), job="values", **fields)
    assert "?queued=0&sent=" in first.headers["Location"]  # at once: the run's page, before the run
    queued = iap_app.get(first.headers["Location"], headers=viewer(iap)).html
    if queued.find(id="outcome").text == "queued":  # the queue may not have started it yet
        assert queued.find(id="answer").text.startswith("Queued:")
        assert "queued=0" in queued.find(id="refreshing")["data-url"]
    double_click = run_now(iap_app, operator(iap), job="values", **fields)
    assert settle(iap_app) == [200]  # one task, however many forms were sent before it ran
    again = run_now(iap_app, operator(iap), job="values", **fields)  # a refresh, after the run
    assert path(first) == path(double_click) == path(again) == f"/admin/runs/{run_id_of(first)}"
    assert again.headers["Location"].endswith("?answer=form_used")  # the form was used: reload for a new run
    assert [e["parameters"] for e in job_targets.EFFECTS] == [{"value": 7}]
    page = iap_app.get(first.headers["Location"], headers=viewer(iap))
    assert page.html.find(id="answer").text.startswith("Started")
    assert "completed" in page.text and "user:alice@example.com" in page.text
    document = iap_app.get(f"/api/v1/runs/{run_id_of(first)}", headers=viewer(iap)).json
    assert document["requested_by"] == "user:alice@example.com"
    assert document["client_token"] == token and document["result"] == 7


def test_the_same_form_with_other_parameters_conflicts(iap_app, iap):
    run_now(iap_app, operator(iap), job="values", clientToken="form-1", parameters='{"value": 1}')
    settle(iap_app)
    page = run_now(iap_app, operator(iap), job="values", status=422, clientToken="form-1", parameters='{"value": 2}')
    assert "already sent with other parameters" in page.text and 'id="existing-run"' in page.text
    assert len(job_targets.EFFECTS) == 1


def test_a_viewer_who_posts_anyway_is_refused(iap_app, iap, ndb_client):
    response = run_now(iap_app, viewer(iap), status=403, clientToken="form-1", parameters="{}")
    assert response.json["error"] == "Forbidden" and "operator" in response.json["message"]
    assert nothing_written(ndb_client)


def test_nobody_signed_in_is_refused(iap_app, ndb_client):
    run_now(iap_app, SAME_ORIGIN, status=401, clientToken="form-1", parameters="{}")
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "fetch_site, origin", [("cross-site", None), ("same-site", None), (None, "https://evil.example")]
)
def test_a_cross_site_post_is_refused(iap_app, iap, ndb_client, fetch_site, origin):
    headers = as_person(iap, OPERATOR)
    if fetch_site:
        headers["Sec-Fetch-Site"] = fetch_site
    if origin:
        headers["Origin"] = origin
    run_now(iap_app, headers, status=403, clientToken="form-1", parameters="{}")
    assert nothing_written(ndb_client)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"parameters": "{}"}, "clientToken must be 1 to 64 characters"),
        ({"clientToken": "", "parameters": "{}"}, "clientToken must be 1 to 64 characters"),
        ({"clientToken": "x" * 65, "parameters": "{}"}, "clientToken must be 1 to 64 characters"),
        ({"clientToken": "a b", "parameters": "{}"}, "may contain only ASCII characters 33 to 126"),
        ({"clientToken": "a\u00e9", "parameters": "{}"}, "may contain only ASCII characters 33 to 126"),
        ({"clientToken": "t", "parameters": "{not json"}, "the parameters text is not valid JSON"),
        ({"clientToken": "t", "parameters": "[1, 2]"}, "must be a JSON object"),
        ({"clientToken": "t", "parameters": '"text"'}, "must be a JSON object"),
        ({"clientToken": "t", "parameters": '{"a": NaN}'}, "NaN is not JSON"),
        ({"clientToken": "t", "parameters": '{"a": ' * 150 + "1" + "}" * 150}, "nested more than 100 levels"),
        ({"clientToken": "t", "parameters": '{"a": "\\ud800"}'}, "not valid JSON"),
        ({"clientToken": "t", "parameters": json.dumps({"a": "x" * 300_000})}, "at most 262144 are kept"),
        ({"clientToken": "t", "parameters": "{}", "extra": "1"}, "unknown form field(s) extra"),
    ],
)
def test_bad_forms_are_400_and_write_nothing(iap_app, iap, ndb_client, fields, words):
    page = run_now(iap_app, operator(iap), status=400, **fields)
    assert words in page.text, page.text
    assert page.content_type == "text/html"
    assert nothing_written(ndb_client)


def test_a_field_sent_twice_is_400(iap_app, iap, ndb_client):
    body = "clientToken=a&clientToken=b&parameters=%7B%7D"
    page = iap_app.post(
        "/admin/jobs/invoice/run",
        body,
        headers=operator(iap),
        content_type="application/x-www-form-urlencoded",
        status=400,
    )
    assert "sent more than once: clientToken" in page.text
    assert nothing_written(ndb_client)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "multipart/form-data; boundary=x"])
def test_only_urlencoded_forms_are_taken(iap_app, iap, ndb_client, content_type):
    iap_app.post(
        "/admin/jobs/invoice/run", "clientToken=t", headers=operator(iap), content_type=content_type, status=415
    )
    assert nothing_written(ndb_client)


def test_an_unknown_job_is_404(iap_app, iap, ndb_client):
    run_now(iap_app, operator(iap), job="nope", status=404, clientToken="t", parameters="{}")
    assert nothing_written(ndb_client)


def test_the_problem_page_escapes_what_the_operator_sent(iap_app, iap):
    page = run_now(iap_app, operator(iap), status=400, clientToken="t", parameters="<script>alert(1)</script>")
    assert "<script>alert" not in page.text


def retry(app, run_id, headers, status=303):
    """The Retry form as a browser sends it: urlencoded, no fields."""
    url = f"/admin/runs/{run_id}/retry"
    return app.post(url, "", headers=headers, content_type="application/x-www-form-urlencoded", status=status)


def test_retry_runs_a_failed_manual_run_again_once(iap_app, iap):
    """Retrying a run is one decision: two pages (two tabs, a reload) and resent forms are one new run."""
    job_targets.FAILURES["flaky"] = ["permanent", "permanent"]
    failed = start(iap_app, job="flaky", token="first", parameters={"invoice": 12}, headers=operator(iap), status=422)
    failed_id = failed.json["run_id"]
    pages = [iap_app.get(f"/admin/runs/{failed_id}", headers=operator(iap)) for _ in range(2)]
    assert all('id="retry"' in page.text for page in pages)
    confirm = iap_app.get(pages[0].html.find(id="retry")["href"], headers=operator(iap)).html
    assert confirm.find(id="confirm-title").text == "Retry this failed run of flaky?"
    assert '{"invoice": 12}' in confirm.find(id="confirm-facts").text
    sent = [retry(iap_app, failed_id, operator(iap)) for _ in range(3)]
    settle(iap_app)
    assert len({path(answer) for answer in sent}) == 1
    assert sent[0].headers["Location"] != f"/admin/runs/{failed_id}"
    assert [(e["client_token"], e["parameters"]) for e in job_targets.EFFECTS] == [
        ("first", {"invoice": 12}),
        (f"retry-{failed_id}"[:64], {"invoice": 12}),
    ]
    retry_id = run_id_of(sent[0])
    document = iap_app.get(f"/api/v1/runs/{retry_id}", headers=viewer(iap)).json
    assert document["status"] == "failed" and document["requested_by"] == "user:alice@example.com"
    # The retry failed too: retrying it is a decision of its own, made once.
    again = [retry(iap_app, retry_id, operator(iap)) for _ in range(2)]
    settle(iap_app)
    assert run_id_of(again[0]) == run_id_of(again[1]) not in (failed_id, retry_id)
    assert len(job_targets.EFFECTS) == 3
    assert iap_app.get(f"/api/v1/runs/{run_id_of(again[0])}", headers=viewer(iap)).json["status"] == "completed"
    # A form cannot choose the retry's token.
    iap_app.post(f"/admin/runs/{failed_id}/retry", {"clientToken": "mine"}, headers=operator(iap), status=400)
    assert len(job_targets.EFFECTS) == 3


def test_retry_is_offered_only_to_operators_on_failed_manual_runs(iap_app, iap):
    done = start(iap_app, job="invoice", token="done", headers=operator(iap), status=201).json["run_id"]
    assert 'id="retry"' not in iap_app.get(f"/admin/runs/{done}", headers=operator(iap)).text
    refused = iap_app.post(f"/admin/runs/{done}/retry", {"clientToken": "r"}, headers=operator(iap), status=409)
    assert "only a failed manual run can be retried" in refused.text
    job_targets.FAILURES["flaky"] = ["permanent"]
    failed = start(iap_app, job="flaky", token="f", headers=operator(iap), status=422).json["run_id"]
    assert 'id="retry"' not in iap_app.get(f"/admin/runs/{failed}", headers=viewer(iap)).text
    iap_app.post(f"/admin/runs/{failed}/retry", {"clientToken": "r"}, headers=viewer(iap), status=403)
    iap_app.post(f"/admin/runs/{'0' * 64}/retry", {"clientToken": "r"}, headers=operator(iap), status=404)
    iap_app.post("/admin/runs/not-a-run/retry", {"clientToken": "r"}, headers=operator(iap), status=404)
    assert len(job_targets.EFFECTS) == 2


def test_a_released_run_sent_again_is_queued_again(iap_app, iap):
    """Cloud Tasks retries a task its run released (500); the same form sent again queues it too."""
    job_targets.FAILURES["flaky"] = ["retryable"]
    without_retries(iap_app)  # the form sent again before the queue's retry
    first = run_now(iap_app, operator(iap), job="flaky", clientToken="form-r", parameters='{"n": 1}')
    assert settle(iap_app) == [500]  # released: a queue retries it
    page = iap_app.get(path(first), headers=viewer(iap)).html
    assert page.find(id="outcome").text == "released"
    again = run_now(iap_app, operator(iap), job="flaky", clientToken="form-r", parameters='{"n": 1}')
    assert again.headers["Location"].startswith(f"{path(first)}?queued=1&sent=")  # queued after attempt 1
    assert settle(iap_app) == [500, 200]
    assert iap_app.get(f"/api/v1/runs/{run_id_of(first)}", headers=viewer(iap)).json["attempt"] == 2
    assert [e["client_token"] for e in job_targets.EFFECTS] == ["form-r", "form-r"]


def test_a_queue_that_refuses_the_run_says_so_and_offers_the_form_again(iap_app, iap, ndb_client):
    from dispatch import DispatchError

    class Refusing:
        def dispatch(self, work):
            raise DispatchError("the queue is paused")

    import dataclasses

    extensions = iap_app.app.extensions
    extensions["dedup"] = dataclasses.replace(extensions["dedup"], dispatcher=Refusing())
    page = run_now(iap_app, operator(iap), job="values", status=502, clientToken="form-q", parameters='{"value": 3}')
    assert "the queue is paused" in page.text and page.forms["resend"]["clientToken"].value == "form-q"
    assert nothing_written(ndb_client)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def served(iap_app):
    server = make_server("127.0.0.1", 0, iap_app.app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_the_forms_in_a_browser(served, iap, iap_app):
    from playwright.sync_api import sync_playwright

    job_targets.FAILURES["flaky"] = ["permanent"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        # IAP adds its assertion to every request it lets through; here the browser sends it.
        as_operator = browser.new_context(extra_http_headers=as_person(iap, OPERATOR))
        page = as_operator.new_page()
        page.goto(f"{served}/admin/")
        page.locator(".job-card[data-job='values'] a.run-now").click()
        page.wait_for_selector("#confirm-title")  # the confirmation names the job and what it calls
        assert page.locator("#calls").inner_text() == "the Python function tests.job_targets:echo_value"
        page.locator("textarea[name=parameters]").fill('{"value": "from the browser"}')
        page.locator("#confirm-button").click()
        page.wait_for_url("**/admin/runs/**?queued=0&sent=*")  # at once, before the run
        run_url = page.url
        # The page asks again by itself (a stop button where the script runs) until the run has ended.
        page.wait_for_function("document.getElementById('outcome').textContent === 'completed'", timeout=20000)
        assert page.locator("#refreshing").count() == 0
        # "Started" is said once, on the first page after the task ran; a later refresh says nothing.
        assert page.locator("#answer").count() == 0 or page.locator("#answer").inner_text().startswith("Started")
        assert page.locator("#requested-by").inner_text() == "user:alice@example.com"
        # Back to the confirmation as it was rendered, and sent again: the same run, not a second one.
        page.go_back()
        page.locator("#confirm-button").click()
        page.wait_for_url(run_url.split("?")[0] + "?answer=form_used")
        # Issue 39 §10: it says why nothing ran, and how to start a new run (the link reloads the dashboard).
        assert page.locator("#answer").inner_text().startswith("This form was already used")
        assert page.locator("#new-run").get_attribute("href") == "/admin/?job=values"
        page.reload()  # a refresh of the run's page is a GET (POST-redirect-GET)
        assert [e["parameters"] for e in job_targets.EFFECTS] == [{"value": "from the browser"}]
        # A failed manual run, retried from its page.
        page.goto(f"{served}/admin/jobs/flaky/run")
        page.locator("#confirm-button").click()
        page.wait_for_url("**/admin/runs/**")
        settle(iap_app)
        page.reload()
        assert page.locator("#outcome").inner_text() == "failed"
        failed_url = page.url
        page.locator("#retry").click()
        page.locator("#confirm-button").click()
        page.wait_for_function(f"location.href !== {json.dumps(failed_url)} && location.href.includes('/admin/runs/')")
        settle(iap_app)
        page.reload()
        assert page.locator("#outcome").inner_text() == "completed"
        assert len(job_targets.EFFECTS) == 3
        # A viewer sees no buttons.
        as_viewer = browser.new_context(extra_http_headers=as_person(iap, VIEWER))
        viewer_page = as_viewer.new_page()
        viewer_page.goto(f"{served}/admin/")
        assert viewer_page.locator("a.run-now").count() == 0
        viewer_page.goto(run_url)
        assert viewer_page.locator("#retry").count() == 0
        browser.close()


def test_a_job_no_longer_declared_is_an_html_page_and_offers_no_retry(iap_app, iap, ndb_client):
    job_targets.FAILURES["flaky"] = ["permanent"]
    failed = start(iap_app, job="flaky", token="f", headers=operator(iap), status=422).json["run_id"]
    del iap_app.app.extensions["dedup"].jobs["flaky"]  # the jobs file changed and the app restarted
    assert 'id="retry"' not in iap_app.get(f"/admin/runs/{failed}", headers=operator(iap)).text
    page = iap_app.post(f"/admin/runs/{failed}/retry", {"clientToken": "r"}, headers=operator(iap), status=409)
    assert page.content_type == "text/html" and "no longer declared" in page.text
    unknown = run_now(iap_app, operator(iap), job="nope", status=404, clientToken="t", parameters="{}")
    assert unknown.content_type == "text/html" and "no job &#39;nope&#39; is declared" in unknown.text
