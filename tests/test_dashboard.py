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
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
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
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.goto(f"{site}/admin/")
        assert page.title() == "Dedup runs"
        # The page names its one window, and each view is of it; with no scheduler.yaml there are
        # no slots to draw, and the timeline says so rather than drawing runs of its own window.
        assert page.locator("#window-words").inner_text() == "the last 24 hours"
        assert page.locator("#window-24h").get_attribute("aria-current") == "page"
        assert page.locator("#no-strips").count() == 1
        # Per job: running with lease time left, and stuck (its page says what is known).
        slow_card = page.locator(".job-card[data-job='slow']")
        assert "lease 45 s left" in slow_card.inner_text()
        assert "Stuck" in page.locator(".job-card[data-job='sync-crm']").inner_text()
        assert "Success rate" not in page.locator("main").inner_text()  # a window of its own: gone
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
        assert "<script>window.pwned = 1</script>" in page.locator("#error").inner_text()  # shown as text
        assert page.evaluate("window.pwned") is None
        page.screenshot(path=os.path.join(artifacts, "run.png"), full_page=True)
        browser.close()
    assert os.path.getsize(os.path.join(artifacts, "dashboard.png")) > 10000


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_on_a_phone_and_by_keyboard(site):
    """Issue 25 §7: 390 px wide with no horizontal scroll and 44 px touch targets; a skip link and
    landmarks; the keyboard reaches a job's actions before the timeline's links; no status told
    by colour alone, and the legend covers every status the page shows."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
        for path in ("/admin/", "/admin/?job=invoice", "/admin/?job=no-such-job"):
            phone.goto(f"{site}{path}")
            assert phone.evaluate("window.innerWidth") == 390, path  # laid out for the phone, not at 980 px
            assert phone.evaluate("document.documentElement.scrollWidth") <= 390, path
            small = phone.evaluate(
                """() => [...document.querySelectorAll('button, select, input:not([type=hidden]), textarea, '
                     + 'a.run-now, a.run-slot, a.pause, a.resume, #retry, #run-again, #bulk-run')]
                     .filter(e => e.offsetParent !== null && e.getBoundingClientRect().height < 44)
                     .map(e => e.outerHTML.slice(0, 80))"""
            )
            assert small == [], (path, small)
        phone.goto(f"{site}/admin/")
        run_link = phone.locator("tr.run-row a").first
        run_link.click()
        phone.wait_for_selector("#attempts")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390

        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(f"{site}/admin/")
        assert page.locator("main#main").count() == 1 and page.locator("header nav").count() == 1
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"
        order = []
        for _ in range(60):
            page.keyboard.press("Tab")
            order.append(
                page.evaluate(
                    "(e => e.closest('#timeline') ? 'timeline'"
                    " : e.classList.contains('run-now') ? 'action' : e.tagName)"
                    "(document.activeElement)"
                )
            )
        # The keyboard reaches a job's actions; the timeline adds no tab stop (its buckets are
        # reached through the cards' counts), and each strip is an image with a text alternative.
        assert "action" in order and "timeline" not in order
        assert page.locator("#timeline a, #timeline [tabindex]").count() == 0
        shown = set(
            page.evaluate(
                """[...document.querySelectorAll('main .badge')]
                     .filter(e => !e.closest('#legend')).map(e => e.classList[e.classList.length - 1])"""
            )
        )
        legend = set(page.evaluate("[...document.querySelectorAll('#legend li')].map(li => li.dataset.status)"))
        assert shown and shown <= legend, shown - legend
        browser.close()
