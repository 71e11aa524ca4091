"""The operator dashboard in a real headless browser (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import requests
from werkzeug.serving import make_server

from dedup.ledger import RunDescription, RunPolicy
from handlers import create_app
from tests import job_targets
from tests.support import POLL_SECONDS
from tests.support.deliveries import scheduler_headers
from tests.support.downstream import Downstream, Reply

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ATTACK = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


@pytest.fixture
def site(datastore, ndb_client, jobs_file, clock):
    with Downstream() as downstream:
        app = create_app(
            jobs_file=jobs_file(f"""
            jobs:
              invoice:
                kind: python
                target: tests.job_targets:record
                lease_seconds: 60
              slow:
                kind: python
                target: tests.job_targets:gated
                lease_seconds: 60
              sync-crm:
                kind: http
                url: {downstream.url}/hooks
                timeout_seconds: 5
                lease_seconds: 60
        """),
            clock=clock,
            ndb_client=ndb_client,
        )
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}"

        def deliver(job, schedule_time, scheduler_job_name=None, body=b""):
            return requests.post(
                f"{url}/jobs/{job}",
                data=body,
                timeout=30,
                headers=scheduler_headers(scheduler_job_name=scheduler_job_name or job, schedule_time=schedule_time),
            )

        for hour in range(3):
            assert deliver("invoice", f"2026-11-2{hour}T02:00:00Z").status_code == 200
        downstream.script = [Reply(400, f'{{"error": "{ATTACK}"}}'.encode())]
        assert deliver("sync-crm", "2026-11-22T03:00:00Z").status_code == 422
        assert (
            requests.post(f"{url}/api/v1/jobs/invoice/runs", json={"clientToken": "manual-1"}, timeout=30).status_code
            == 201
        )
        # A run stuck with its lease over, and one still running with time left.
        state = app.extensions["dedup"]
        with ndb_client.context():
            state.ledger.claim_run("f" * 64, RunDescription("scheduler", "sync-crm", "sync-crm"), RunPolicy(10, 3600))
        clock.advance(30)
        running = threading.Thread(target=deliver, args=("slow", "2026-11-22T05:00:00Z", None, b"dash"))
        running.start()
        for _ in range(200):
            if "dash" in job_targets.STARTED and job_targets.STARTED["dash"].is_set():
                break
            threading.Event().wait(0.05)
        clock.advance(15)
        yield url
        job_targets.GATES.setdefault("dash", threading.Event()).set()
        running.join(10)
        server.shutdown()


def test_values_are_escaped_in_the_html(site):
    page = requests.get(
        f"{site}/admin/runs/"
        + requests.get(f"{site}/api/v1/runs?job=sync-crm&status=failed").json()["runs"][0]["run_id"]
    ).text
    assert "<script>window.pwned" not in page and "&lt;script&gt;window.pwned" in page


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_the_dashboard_in_a_browser(site, tmp_path):
    from playwright.sync_api import sync_playwright

    artifacts = os.path.join(ROOT, "test-artifacts")
    os.makedirs(artifacts, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.goto(f"{site}/admin/")
        assert page.title() == "Dedup runs"
        # The chart draws: one mark per run, coloured by outcome.
        marks = page.locator("svg#timeline circle.mark")
        assert marks.count() == 7
        assert page.locator("svg#timeline circle.mark.failed").count() == 1
        assert page.locator("svg#timeline circle.mark.stuck").count() == 1
        assert page.locator("svg#timeline circle.mark.in_progress").count() == 1
        box = page.locator("svg#timeline").bounding_box()
        assert box["width"] > 500 and box["height"] > 60
        # Per job: success rate, running with lease time left, stuck.
        slow_card = page.locator(".job-card[data-job='slow']")
        assert "lease 45 s left" in slow_card.inner_text()
        assert "Stuck" in page.locator(".job-card[data-job='sync-crm']").inner_text()
        assert "Success rate: 100%" in page.locator(".job-card[data-job='invoice']").inner_text()
        page.screenshot(path=os.path.join(artifacts, "dashboard.png"), full_page=True)
        # Filters work.
        page.select_option("#filter-job", "invoice")
        page.click("#apply-filters")
        page.wait_for_url("**job=invoice**")
        rows = page.locator("tr.run-row")
        assert rows.count() == 4
        assert all(text.split("\t")[1] == "invoice" for text in rows.all_inner_texts())
        page.select_option("#filter-source", "api")
        page.click("#apply-filters")
        assert page.locator("tr.run-row").count() == 1
        # A run's page: attempts and the stored error, escaped, and no script ran.
        page.goto(f"{site}/admin/?status=failed")
        page.locator("tr.run-row a").first.click()
        page.wait_for_selector("#attempts")
        assert page.locator("#attempts tbody tr").count() == 1
        assert "<script>window.pwned = 1</script>" in page.locator("#stored").inner_text()  # shown as text
        assert page.evaluate("window.pwned") is None
        page.screenshot(path=os.path.join(artifacts, "run.png"), full_page=True)
        browser.close()
    assert os.path.getsize(os.path.join(artifacts, "dashboard.png")) > 10000
