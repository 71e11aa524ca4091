"""Issue 24 §2: operators pause and resume a Scheduler job from its job card (no script, forms only)."""

from __future__ import annotations

import pytest
import webtest

from devtools.cloud_tasks_fake import to_webtest
from tests import job_targets
from tests.support.deliveries import JOBS
from tests.support.schedule_sites import schedule_site

SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, start_at: 2030-01-01T00:00:00Z, attempt_deadline: 60s}
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *", retry: {retry_count: 1, min_backoff: 1m}}
"""
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def site(cloud_tasks, google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    return schedule_site(tmp_path, JOBS, SCHEDULES, clock, ndb_client)


def card(site) -> webtest.TestResponse:
    return site.get("/admin/", params={"job": "invoice"})


def test_pause_then_resume_with_catch_up_from_the_card(site, clock, cloud_tasks, google):
    clock.advance(1800)
    page = card(site)
    assert 'data-scheduler-job="invoice-hourly"' in page.text and "enabled" in page.text
    confirm = site.get(page.html.select_one("a.pause")["href"])
    assert confirm.html.find(id="confirm-title").text == "Pause invoice-hourly?"
    calls = confirm.html.find(id="calls").text
    assert calls == "projects/acme-prod/locations/us-central1/jobs/invoice-hourly (0 * * * *, Etc/UTC)"
    form = confirm.forms["confirm"]
    form["note"] = "incident 4711"
    paused = form.submit(headers=SAME_ORIGIN, status=303)
    again = form.submit(headers=SAME_ORIGIN, status=303)  # a double click: one pause
    assert paused.headers["Location"] == again.headers["Location"]
    # Issue 39 §10: the page it lands on says what the pause did, and the row shows no next run.
    landed = site.get(paused.headers["Location"]).html
    said = landed.find(id="said").text
    assert said.startswith("Paused invoice-hourly by") and "“incident 4711”" in said
    row = landed.select_one("tr.job-row[data-scheduler-job='invoice-hourly']")
    assert row.select_one(".next").text == "none while paused"
    page = card(site)
    assert page.html.find(id="said") is None  # said once, on the page the action answered with
    assert 'since <time datetime="2030-01-01T00:30:00Z"' in page.text and "(incident 4711)" in page.text
    assert google.scheduler_states["projects/acme-prod/locations/us-central1/jobs/invoice-hourly"] == "PAUSED"
    clock.advance(3 * 3600)  # 03:30: 01:00 to 03:00 paused
    confirm = site.get(card(site).html.select_one("a.resume")["href"])
    assert confirm.html.find(id="confirm-title").text == "Resume invoice-hourly?"
    # The window in words, and how many slots each catch-up would run (not "86400 s").
    facts = confirm.html.find(id="confirm-facts").text
    assert "The pause holds 3 slots that never ran within its catch-up window (1 day back)" in facts
    assert "86400" not in facts
    choices = [o.text for o in confirm.html.select("select[name=catch_up] option")]
    assert choices == [
        "none",
        "the latest slot (1 run)",
        "all its slots (3 runs)",
        "one run of the latest slot standing for all 3 (1 run, 2 covered)",
    ]
    form = confirm.forms["confirm"]
    form["catch_up"] = "all"
    resumed = form.submit(headers=SAME_ORIGIN, status=303)
    assert len(cloud_tasks.tasks) == 3
    said = site.get(resumed.headers["Location"]).html.find(id="said").text
    assert said.startswith("Resumed invoice-hourly") and "the catch-up queued 3 slots of the pause" in said
    cloud_tasks.deliver(to_webtest(site))
    assert len(job_targets.EFFECTS) == 3 and "enabled" in card(site).text


def test_a_bad_or_cross_site_form_is_refused_and_pauses_nothing(site):
    refused = site.post(
        "/admin/scheduler-jobs/invoice-hourly/resume", {"catch_up": "some"}, headers=SAME_ORIGIN, status=400
    )
    assert "catch up must be one of" in refused.text
    long = site.post("/admin/scheduler-jobs/invoice-hourly/pause", {"note": "x" * 501}, headers=SAME_ORIGIN, status=400)
    assert "longer than 500" in long.text
    site.post("/admin/scheduler-jobs/nightly/pause", {"note": ""}, headers=SAME_ORIGIN, status=404)
    cross = site.post(
        "/admin/scheduler-jobs/invoice-hourly/pause", {}, headers={"Sec-Fetch-Site": "cross-site"}, status=403
    )
    assert cross.status_int == 403
    assert "enabled" in card(site).text


def test_resume_with_one_run_standing_for_the_pause_from_the_card(site, clock, cloud_tasks):
    """Issue 41 §3: the card's compacted catch-up, one run for the pause's slots, said so."""
    clock.advance(1800)
    site.post_json("/api/v1/scheduler-jobs/invoice-hourly/pause", {})
    clock.advance(3 * 3600)  # 01:00 to 03:00 paused
    confirm = site.get(card(site).html.select_one("a.resume")["href"])
    form = confirm.forms["confirm"]
    form["catch_up"] = "compact"
    resumed = form.submit(headers=SAME_ORIGIN, status=303)
    said = site.get(resumed.headers["Location"]).html.find(id="said").text
    assert "the catch-up queued one run, the latest slot's, standing for 2 more of the pause, each covered" in said
    cloud_tasks.deliver(to_webtest(site))
    (ran,) = job_targets.EFFECTS
    assert len(ran["covers"]) == 2 and ran["schedule_time"].hour == 3
