"""Issue 25 §5: the dashboard's runs go through Cloud Tasks and answer at once.

Against the Cloud Tasks stand-in (devtools/cloud_tasks_fake.py, speaking the API's request
and response shapes): Run now, Retry and a slot's run each create one named task and answer
with a 303 to the run's page, which says "queued" until the queue delivers the task, then
"started".  A task delivered twice (or two at once) is one run, and a form sent twice before
the task ran is one task.  ``/tasks/manual-run`` settles what a retry cannot cure.
"""

from __future__ import annotations

import json

import pytest

from devtools.cloud_tasks_fake import to_webtest
from tests import job_targets
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import at, schedule_site

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, start_at: 2030-01-01T00:00:00Z, attempt_deadline: 60s}
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *"}
"""
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def site(cloud_tasks, google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)  # pauses, in Cloud Scheduler's stand-in
    return schedule_site(tmp_path, JOBS, SCHEDULES, clock, ndb_client)


def confirmed(site, link: str):
    return site.get(link).forms["confirm"]


def test_run_now_is_one_named_task_and_the_page_says_queued_then_started(site, cloud_tasks):
    link = site.get("/admin/").html.select_one(".job-card[data-job='invoice'] a.run-now")["href"]
    form = confirmed(site, link)
    form["parameters"] = '{"invoice": 7}'
    sent = [form.submit(headers=SAME_ORIGIN, status=303) for _ in range(2)]  # a double click
    assert len({answer.headers["Location"] for answer in sent}) == 1
    [task] = cloud_tasks.tasks  # the queue refused the second under the same name
    assert task.relative_uri == "/tasks/manual-run" and task.task_id.startswith("manual-run-")
    body = json.loads(task.body)
    assert body["parameters"] == {"invoice": 7} and body["clientToken"] == form["clientToken"].value
    queued = site.get(sent[0].headers["Location"]).html
    assert queued.find(id="outcome").text == "queued" and job_targets.EFFECTS == []
    refresh = queued.find(id="refreshing")["data-url"]
    assert sent[0].headers["Location"].split("/admin", 1)[1] in refresh  # it keeps asking after the run
    cloud_tasks.deliver(to_webtest(site), times=2, at_once=True)  # two instances of the queue, at once
    assert len(job_targets.EFFECTS) == 1 and job_targets.EFFECTS[0]["parameters"] == {"invoice": 7}
    page = site.get(sent[0].headers["Location"]).html
    assert page.find(id="outcome").text == "completed" and page.find(id="answer").text.startswith("Started")
    assert page.find(id="refreshing") is None
    assert page.find(id="requested-by").text == body["requested_by"]


def test_retry_and_a_slots_run_are_tasks_too(site, cloud_tasks, clock):
    job_targets.FAILURES["invoice"] = ["permanent"] * 3  # the delivery, its slot's rerun, a manual run
    clock.advance(3600 + 10)
    failed = site.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(1)),
        status=422,
    ).json["run_id"]
    again = site.get(f"/admin/runs/{failed}").html.find(id="run-again")["href"]
    answer = confirmed(site, again).submit(headers=SAME_ORIGIN, status=303)
    assert answer.headers["Location"] == f"/admin/runs/{failed}?queued=1"
    [task] = cloud_tasks.tasks
    assert task.relative_uri == "/tasks/run-slot" and json.loads(task.body)["attempt"] == 1
    # Issue 39 §10: while queued, the page says one thing: queued, waiting, no old badge, no "run again".
    waiting = site.get(answer.headers["Location"]).html
    assert waiting.find(id="outcome").text == "queued" and waiting.find(id="run-again") is None
    assert waiting.find(id="answer").text.startswith("Queued") and "Still going" not in waiting.text
    assert waiting.select(".badge.failed") == []
    cloud_tasks.deliver(to_webtest(site))
    assert site.get(answer.headers["Location"]).html.find(id="outcome").text == "failed"  # it failed again
    assert len(job_targets.EFFECTS) == 2
    # A manual run that failed, retried: its own task.
    manual = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}, status="*").json
    assert manual["status"] == "failed"
    cloud_tasks.reset()
    retry = confirmed(site, f"/admin/runs/{manual['run_id']}/retry").submit(headers=SAME_ORIGIN, status=303)
    [task] = cloud_tasks.tasks
    assert task.relative_uri == "/tasks/manual-run" and json.loads(task.body)["clientToken"].startswith("retry-")
    cloud_tasks.deliver(to_webtest(site))
    assert site.get(retry.headers["Location"]).html.find(id="outcome").text == "completed"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"job_id": "invoice"},
        {"job_id": "invoice", "clientToken": "t", "parameters": {}, "requested_by": "x", "extra": 1},
        {"job_id": 7, "clientToken": "t", "parameters": {}, "requested_by": "x"},
        {"job_id": "invoice", "clientToken": "t", "parameters": [], "requested_by": "x"},
        {"job_id": "invoice", "clientToken": None, "parameters": {}, "requested_by": "x"},
        ["not", "an", "object"],
    ],
)
def test_a_manual_run_task_with_a_bad_body_is_400(site, body):
    answer = site.post_json("/tasks/manual-run", body, headers={"X-AppEngine-QueueName": "q"}, status=400).json
    assert answer["error"] == "InvalidParameterException" and job_targets.EFFECTS == []


@pytest.mark.parametrize(
    "body, status",
    [
        ({"job_id": "nope", "clientToken": "t", "parameters": {}, "requested_by": "x"}, 404),
        ({"job_id": "invoice", "clientToken": "", "parameters": {}, "requested_by": "x"}, 400),
        ({"job_id": "invoice", "clientToken": "x" * 65, "parameters": {}, "requested_by": "x"}, 400),
        ({"job_id": "invoice", "clientToken": "t", "parameters": {"a": "x" * 300_000}, "requested_by": "x"}, 400),
    ],
)
def test_a_manual_run_task_a_retry_cannot_cure_is_settled(site, body, status):
    answer = site.post_json("/tasks/manual-run", body, headers={"X-AppEngine-QueueName": "q"}, status=200).json
    assert answer["settled"] is True and answer["status"] == status and job_targets.EFFECTS == []


def test_a_manual_run_task_queued_by_the_version_before_still_runs_once(site):
    """Its token was named client_token: a deploy may find such a task in the queue, retried."""
    body = {"job_id": "invoice", "client_token": "queued-before", "parameters": {"n": 1}, "requested_by": "ops@x"}
    for _ in range(2):  # delivered twice, as a queue may
        answer = site.post_json("/tasks/manual-run", body, headers={"X-AppEngine-QueueName": "q"}, status=200).json
    assert answer["status"] == "completed" and answer["duplicate"] is True
    assert len(job_targets.EFFECTS) == 1
    # The same token through the run API is the same run.
    again = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "queued-before", "parameters": {"n": 1}})
    assert again.json["run_id"] == answer["run_id"] and len(job_targets.EFFECTS) == 1


@pytest.mark.parametrize(
    "body, status",
    [
        ({"job_id": "invoice", "client_token": "", "parameters": {}, "requested_by": "x"}, 200),  # settled
        ({"job_id": "invoice", "client_token": 7, "parameters": {}, "requested_by": "x"}, 400),
        ({"job_id": "invoice", "client_token": "t", "clientToken": "t", "parameters": {}, "requested_by": "x"}, 400),
    ],
)
def test_an_earlier_manual_run_task_with_a_bad_token_runs_nothing(site, body, status):
    site.post_json("/tasks/manual-run", body, headers={"X-AppEngine-QueueName": "q"}, status=status)
    assert job_targets.EFFECTS == []


@pytest.mark.parametrize("queued", ["", "-1", "x", "\u00b2", "1" * 8, "0 "])
def test_a_missing_run_with_a_bad_queued_mark_is_404(site, queued):
    site.get(f"/admin/runs/{'a' * 64}", params={"queued": queued}, status=404)


def test_a_run_queued_but_not_started_is_a_page_that_waits_for_it(site):
    page = site.get(f"/admin/runs/{'a' * 64}", params={"queued": "0"}).html
    assert page.find(id="outcome").text == "queued" and page.find(id="queue-help") is not None
    site.get("/admin/runs/not-a-run-id", params={"queued": "0"}, status=404)


def test_the_missed_and_failed_slots_shown_run_in_bulk_each_once(site, cloud_tasks, clock):
    job_targets.FAILURES["invoice"] = ["permanent"]
    clock.advance(3600 + 10)
    for hour in (0, 1):  # 00:00 fails for good, 01:00 completes; 02:00 to 04:00 never come
        site.post(
            "/jobs/invoice?project=acme-prod&location=us-central1",
            b"",
            headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour)),
            status="*",
        )
    clock.advance(4 * 3600)  # 05:00:10: the windows of 02:00 to 04:00 have closed
    day = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).html
    offer = day.find(id="bulk-run")
    assert offer.text == "Run the 4 missed or failed slots of this range…"
    confirm = site.get(offer["href"])
    assert confirm.html.find(id="confirm-title").text == "Run 4 slots of invoice?"
    assert confirm.html.find(id="confirm-button").text == "Make these 4 runs"  # the count, not "one run"
    assert "one run" not in confirm.text and "it is still 4 runs" in confirm.text
    facts = confirm.html.find(id="confirm-facts").text
    assert f"{at(0)} (invoice-hourly): failed" in facts and f"{at(4)} (invoice-hourly): missed" in facts
    form = confirm.forms["confirm"]
    answers = [form.submit(headers=SAME_ORIGIN, status=303) for _ in range(2)]  # sent twice: queued once
    assert answers[0].headers["Location"].endswith("bulk=4-0-0") and answers[1].headers["Location"].endswith(
        "bulk=0-4-0"
    )
    answered = site.get(answers[0].headers["Location"]).html
    assert answered.find(id="bulk-answer").text.startswith("This request queued 4 slots to run")
    assert answered.find(id="bulk-run") is None  # issue 39 §7: it offers no run of the slots it just queued
    assert len(cloud_tasks.tasks) == 4 and {t.relative_uri for t in cloud_tasks.tasks} == {"/tasks/run-slot"}
    cloud_tasks.deliver(to_webtest(site), times=2)  # each delivered twice
    listing = site.get("/api/v1/jobs/invoice/executions", params={"since": at(0), "until": at(5)}).json
    assert [e["status"] for e in listing["executions"]] == ["completed"] * 5
    assert len(job_targets.EFFECTS) == 2 + 4  # the two deliveries, then each of the four once
    again = form.submit(headers=SAME_ORIGIN, status=303)  # back, then resubmit, after they ran
    assert again.headers["Location"].endswith("bulk=0-4-0") and len(job_targets.EFFECTS) == 6
    assert site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).html.find(id="bulk-run") is None


@pytest.mark.parametrize(
    "slots",
    [
        "",
        "not five fields",
        f"{at(0)} invoice-hourly acme-prod us-central1",
        f"{at(0)} invoice-hourly acme-prod us-central1 x",
        f"{at(0)} invoice-hourly acme-prod us-central1 {'9' * 5000}",
        "2030-01-01T00:30:00Z invoice-hourly acme-prod us-central1 0",  # no slot of it
        f"{at(0)} other-job acme-prod us-central1 0",
        "\n".join([f"{at(0)} invoice-hourly acme-prod us-central1 0"] * 289),
    ],
)
def test_a_bad_bulk_form_is_a_page_that_says_so_and_queues_nothing(site, cloud_tasks, clock, slots):
    clock.advance(3600)
    page = site.post(
        "/admin/jobs/invoice/history/run", {"slots": slots, "day": "2030-01-01"}, headers=SAME_ORIGIN, status="*"
    )
    assert page.status_int in (400, 404) and page.content_type == "text/html" and cloud_tasks.tasks == []


CHROMIUM = __import__("shutil").which("chromium") or __import__("shutil").which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_the_actions_in_a_browser_at_desktop_and_phone_size(site, cloud_tasks, clock):
    """A bulk run double-clicked, a slot run sent again after going back, and a pause and resume,
    each through its confirmation in Chromium; the phone lays each page out at 390 px."""
    import threading

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from tests.support import POLL_SECONDS

    job_targets.FAILURES["invoice"] = ["permanent"]
    clock.advance(3600 + 10)
    site.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(0)),
        status=422,
    )
    clock.advance(3 * 3600)  # 04:00:10: 00:00 failed, 01:00 to 03:00 missed
    server = make_server("127.0.0.1", 0, site.app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            for size in ({"width": 1280, "height": 900}, {"width": 390, "height": 844}):
                page = browser.new_page(viewport=size, is_mobile=size["width"] < 500)
                cloud_tasks.reset()
                # A slot's run: confirmed, sent, then back and sent again: one task.
                page.goto(f"{url}/admin/?job=invoice")
                page.locator(".job-card a.run-slot").first.click()
                page.wait_for_selector("#confirm-title")
                assert page.evaluate("document.documentElement.scrollWidth") <= size["width"]
                page.locator("#confirm-button").click()
                page.wait_for_url("**/admin/runs/**")
                assert page.locator("#outcome").inner_text() in ("queued", "failed", "missed")
                page.go_back()
                page.locator("#confirm-button").click()
                page.wait_for_url("**/admin/runs/**")
                assert len(cloud_tasks.tasks) == 1
                # The missed and failed slots of the day, in bulk: a double click queues each once.
                page.goto(f"{url}/admin/jobs/invoice/history?day=2030-01-01")
                page.locator("#bulk-run").click()
                page.wait_for_selector("#confirm-title")
                page.locator("#confirm-button").dblclick()
                page.wait_for_selector("#bulk-answer")
                assert page.evaluate("document.documentElement.scrollWidth") <= size["width"]
                slots = {json.loads(t.body)["schedule_time"] for t in cloud_tasks.tasks}
                assert len(slots) == len(cloud_tasks.tasks) == 4  # each slot once, the first one included
                page.close()
            cloud_tasks.deliver(to_webtest(site))
            assert (
                site.get("/api/v1/jobs/invoice/executions", params={"since": at(0), "until": at(4)}).json["executions"][
                    0
                ]["status"]
                == "completed"
            )
            # Pause with a note, then resume, each confirmed.
            page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
            page.goto(f"{url}/admin/?job=invoice")
            page.locator("a.pause").click()
            page.fill("input[name=note]", "bank maintenance")
            page.locator("#confirm-button").click()
            page.wait_for_selector("a.resume")
            assert "bank maintenance" in page.locator(".schedule").inner_text()
            page.locator("a.resume").click()
            page.select_option("select[name=catch_up]", "none")
            page.locator("#confirm-button").click()
            page.wait_for_selector("a.pause")
            browser.close()
    finally:
        server.shutdown()


def test_a_form_resent_with_other_parameters_is_not_dropped_and_the_page_says_which_ran(site, cloud_tasks):
    """Back, another value, send again, before the first task ran: both sends are queued (the
    parameters are in the task's name), the token's one run takes whichever claims first, and
    the page of the send that lost says its parameters did not run."""
    link = site.get("/admin/").html.select_one(".job-card[data-job='invoice'] a.run-now")["href"]
    form = confirmed(site, link)
    form["parameters"] = '{"invoice": 7}'
    first = form.submit(headers=SAME_ORIGIN, status=303)
    form["parameters"] = '{"invoice": 8}'
    second = form.submit(headers=SAME_ORIGIN, status=303)
    assert len(cloud_tasks.tasks) == 2 and len({t.task_id for t in cloud_tasks.tasks}) == 2
    cloud_tasks.deliver(to_webtest(site))
    assert len(job_targets.EFFECTS) == 1 and job_targets.EFFECTS[0]["parameters"] == {"invoice": 7}
    assert site.get(first.headers["Location"]).html.find(id="sent-other") is None
    lost = site.get(second.headers["Location"]).html
    assert lost.find(id="outcome").text == "completed" and "did not run" in lost.find(id="sent-other").text
    assert site.get(second.headers["Location"].replace("sent=", "sent=zz")).html.find(id="sent-other") is None


def test_a_queued_page_stops_refreshing_when_nothing_starts(site):
    """Review of issue 25: a link to a run nothing queued (or a queue that is paused) kept its page
    polling forever.  Each refresh counts itself, and after five minutes the page stops and says so."""
    run_id = "ab" * 32
    page = site.get(f"/admin/runs/{run_id}?queued=0").html
    for _ in range(80):
        refreshing = page.find(id="refreshing")
        if refreshing is None:
            break
        page = site.get(refreshing["data-url"]).html
    assert refreshing is None and page.find(id="not-started").text.startswith("Not started after 5 minutes")
    assert page.find(id="outcome").text == "queued"


def test_a_bulk_run_of_a_range_goes_back_to_that_range(site, cloud_tasks, clock):
    """Review of issue 25: the confirmation kept only the day, so Cancel and the answer left the range."""
    clock.advance(6 * 3600)  # 00:00 to 05:00 all missed
    shown = {"since": at(0), "until": at(3)}
    offer = site.get("/admin/jobs/invoice/history", params=shown).html.find(id="bulk-run")
    confirm = site.get(offer["href"])
    assert "since=" in confirm.html.find(id="cancel")["href"]
    answer = confirm.forms["confirm"].submit(headers=SAME_ORIGIN, status=303)
    location = answer.headers["Location"]
    assert "since=" in location and "until=" in location and location.endswith("bulk=3-0-0")
    said = site.get(location).html
    assert said.find(id="bulk-answer").text.startswith("This request queued 3 slots")


def test_a_stuck_slot_says_what_is_known_and_runs_again_only_when_acknowledged(site, cloud_tasks, clock, ndb_client):
    """Issue 39 §2: a hung attempt is ``stuck``, not ``missed``, and its rerun names the risk."""
    from dedup.keys import scheduled_run_key
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    key = scheduled_run_key("invoice-hourly", at(1), query_project="acme-prod", query_location="us-central1")
    description = RunDescription(
        "scheduler", "invoice", "invoice-hourly", key.schedule_time, project="acme-prod", location="us-central1"
    )
    clock.advance(3600 + 5)
    with ndb_client.context():  # 01:00's attempt starts, then its worker dies holding a 60 s lease
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 604800))
    clock.advance(6 * 3600)  # hours later: no retry can take it over
    page = site.get(f"/admin/runs/{key.run_id}").html
    assert page.find(id="outcome").text == "stuck"
    stuck = page.find(id="stuck").text
    assert "attempt 1 started" in stuck and "its lease ran out" in stuck and "No retry of this slot can come" in stuck
    assert "recorded no downstream resource" in stuck and key.run_id in stuck
    history = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).html
    assert history.select_one(f"tr.slot-row[data-schedule-time='{at(1)}']")["data-status"] == "stuck"
    confirm = site.get(page.find(id="run-again")["href"])
    facts = confirm.html.find(id="confirm-facts").text
    assert "may have taken effect" in facts and key.run_id in facts
    box = confirm.html.select_one("form#confirm input[name='force']")
    assert box.has_attr("required") and key.run_id in box.parent.text
    form = confirm.forms["confirm"]
    refused = form.submit(headers=SAME_ORIGIN, status=422)  # the box unticked (a script, a stale page)
    assert "force=true" in refused.text and cloud_tasks.tasks == []
    form["force"] = True
    answer = form.submit(headers=SAME_ORIGIN, status=303)
    assert answer.headers["Location"].startswith(f"/admin/runs/{key.run_id}?queued=")
    [task] = cloud_tasks.tasks
    assert json.loads(task.body)["force"] is True
    cloud_tasks.deliver(to_webtest(site))
    assert site.get(f"/admin/runs/{key.run_id}").html.find(id="outcome").text == "completed"
    assert len(job_targets.EFFECTS) == 1
