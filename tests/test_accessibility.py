"""Issue 25 §7: axe-core (the npm package, vendored) finds no serious or critical violation on
any page a person meets, at desktop and at phone size.

A day of an hourly Scheduler job (runs completed, failed for good, missed, a manual run, a
pause) gives every page something to show: the dashboard and a job's card, a run's page,
a day's history, each confirmation, a queued run, an error page and a search's list.
"""

from __future__ import annotations

import shutil
import textwrap
import threading

import pytest
import webtest
from werkzeug.serving import make_server

from handlers import create_app
from tests import job_targets
from tests.support import POLL_SECONDS
from tests.support.axe import violations
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import at

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu"]
JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:scripted_failures
    lease_seconds: 60
    retention_seconds: 604800
  digest:
    kind: python
    target: tests.job_targets:record
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *", time_zone: Europe/Berlin}
  digest-daily: {target: digest, schedule: "30 6 * * *"}
"""


@pytest.fixture
def served(google, ndb_client, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    app = create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client)
    site = webtest.TestApp(app)
    site.get("/api/v1/scheduler-jobs")
    job_targets.FAILURES["invoice"] = [None, "permanent"]
    clock.advance(2 * 3600 + 10)
    runs = []
    for hour in (0, 1):  # 00:00 completes, 01:00 fails for good; 02:00 and later never come
        headers = scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time=at(hour))
        runs.append(site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status="*"))
    site.post_json("/api/v1/jobs/digest/runs", {"clientToken": "by-hand"})
    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}, status="*")
    clock.advance(3 * 3600)
    site.post_json("/api/v1/scheduler-jobs/digest-daily/pause", {"note": "incident 4711"})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", [r.json["run_id"] for r in runs]
    server.shutdown()


def pages(failed_run: str) -> list[str]:
    slot = f"/admin/jobs/invoice/executions/{at(2)}/run?scheduler_job=invoice-hourly&project=acme-prod"
    return [
        "/admin/",
        "/admin/?job=invoice",
        "/admin/?window=night",
        "/admin/?window=range&first=2030-01-01&last=2030-01-02",
        "/admin/jobs/invoice/history?since=2030-01-01T00:00:00Z&until=2030-01-02T00:00:00Z&status=failed",
        "/admin/search?q=2030-01-01+06:30",
        f"/admin/runs/{failed_run}",
        "/admin/jobs/invoice/history?day=2030-01-01",
        "/admin/jobs/invoice/history?day=2030-01-01&status=missed",
        "/admin/jobs/invoice/run",
        f"{slot}&location=us-central1&attempt=0",
        "/admin/jobs/invoice/history/run?day=2030-01-01",
        "/admin/scheduler-jobs/digest-daily/resume?project=acme-prod&location=us-central1",
        "/admin/scheduler-jobs/invoice-hourly/pause?project=acme-prod&location=us-central1",
        f"/admin/runs/{'a' * 64}?queued=0",
        "/admin/search?q=by-hand",
        "/admin/runs/" + "0" * 64,  # a 404 page
    ]


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_axe_finds_nothing_serious_on_any_page_at_either_size(served):
    from playwright.sync_api import sync_playwright

    site, (_, failed) = served
    found = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        for size in ({"width": 1280, "height": 1000}, {"width": 390, "height": 844}):
            page = browser.new_page(viewport=size, is_mobile=size["width"] < 500)
            for path in pages(failed):
                page.goto(f"{site}{path}")
                assert page.locator("main").count() == 1, path  # a page of the app, not a bare error
                problems = violations(page)
                if problems:
                    found[(size["width"], path)] = problems
            page.close()
        browser.close()
    assert found == {}, "\n".join(f"{key}: {problems}" for key, problems in found.items())
