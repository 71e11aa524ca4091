"""Issue 37 §1: the home page shows a page of Scheduler jobs, those that need attention first, with a search.

The order comes from what each audit share judged (schedules/attention.py), read in one lookup
with the pauses changed since.  A page's reads and calls then follow the rows it shows, not the
fleet: 100 Scheduler jobs and 300 cost the same.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest

from devtools.rpc_counter import counting_client
from handlers import create_app
from handlers.job_rows import ROWS_PER_PAGE
from models.attention_share import AttentionShare
from schedules import attention
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import CRON, T0

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    retention_seconds: 1209600
"""
SCOPE = "?project=acme-prod&location=us-central1"


def fleet(tmp_path, client, clock, count: int, width: int = 2) -> webtest.TestApp:
    """``count`` hourly Scheduler jobs (``hourly-00`` ...) of one job, named so their order is plain."""
    folder = tmp_path / f"fleet-{count}"
    folder.mkdir()
    (folder / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    defaults = '{project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}'
    (folder / "scheduler.yaml").write_text(
        f"defaults: {defaults}\n"
        "jobs:\n"
        + "".join(f"  hourly-{n:0{width}d}: {{target: invoice, schedule: '0 * * * *'}}\n" for n in range(count))
    )
    return webtest.TestApp(create_app(jobs_file=str(folder / "jobs.yaml"), clock=clock, ndb_client=client))


def shown(page) -> list[str]:
    return [tr["data-scheduler-job"] for tr in page.html.select("tr.job-row")]


def run_a_day(site: webtest.TestApp, clock, count: int, missing: set[int]) -> None:
    """A day of hourly slots, delivered but for the jobs in ``missing``; then the audit's pass."""
    for hour in range(25):  # to the slot of the last 24 hours' end, at 24:00
        clock.advance((T0 + datetime.timedelta(hours=hour, seconds=5) - clock.now()).total_seconds())
        for n in range(count):
            if n not in missing:
                when = (T0 + datetime.timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
                headers = scheduler_headers(scheduler_job_name=f"hourly-{n:02d}", schedule_time=when)
                site.post(f"/jobs/invoice{SCOPE}", b"", headers=headers, status=200)
    clock.advance((T0 + datetime.timedelta(hours=24, minutes=30) - clock.now()).total_seconds())
    site.get("/tasks/audit", headers=CRON)


@pytest.mark.slow  # a day of 60 hourly Scheduler jobs' deliveries: make test runs it
def test_a_page_of_rows_puts_those_needing_attention_first_and_pages_and_searches_the_rest(
    google, ndb_client, tmp_path, clock, monkeypatch
):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    site = fleet(tmp_path, ndb_client, clock, 60)
    site.get("/api/v1/scheduler-jobs")
    run_a_day(site, clock, 60, missing={41, 57})
    site.post_json("/api/v1/scheduler-jobs/hourly-33/pause", {"note": "maintenance"})
    first = site.get("/admin/")
    # The two that missed their day and the paused one, by name, then the rest by name.
    assert shown(first)[:3] == ["hourly-33", "hourly-41", "hourly-57"]
    assert shown(first)[3:] == [f"hourly-{n:02d}" for n in range(60) if n not in (33, 41, 57)][: ROWS_PER_PAGE - 3]
    assert [tr["data-attention"] for tr in first.html.select("tr.job-row")][:4] == ["yes", "yes", "yes", "no"]
    pages = first.html.find(id="row-pages")
    assert "60 Scheduler jobs" in pages.text and "page 1 of 3" in pages.text and "25 shown" in pages.text
    second = site.get(pages.find("a", rel="next")["href"])
    last = site.get(second.html.find(id="row-pages").find("a", rel="next")["href"])
    every = shown(first) + shown(second) + shown(last)
    assert len(shown(last)) == 10 and sorted(every) == [f"hourly-{n:02d}" for n in range(60)]  # each once
    assert last.html.find(id="row-pages").find("a", rel="next") is None
    assert last.html.find(id="row-pages").find("a", rel="prev") is not None
    # A search keeps the order among the names it finds, and pages what it finds.
    found = site.get("/admin/", params={"q": "LY-4"})  # case aside: hourly-40 ... hourly-49
    assert shown(found) == ["hourly-41", *[f"hourly-{n}" for n in range(40, 50) if n != 41]]
    assert "10 Scheduler jobs whose name contains “LY-4”" in found.html.find(id="row-pages").text
    assert shown(site.get("/admin/", params={"q": "nothing-like-it"})) == []
    # The job filter narrows the rows as it narrows the cards.
    assert len(shown(site.get("/admin/", params={"job": "invoice"}))) == ROWS_PER_PAGE
    # Once resumed, the paused one sorts by name again.
    site.post_json("/api/v1/scheduler-jobs/hourly-33/resume", {"catch_up": "none"})
    assert shown(site.get("/admin/"))[:3] == ["hourly-41", "hourly-57", "hourly-00"]


@pytest.mark.parametrize(
    "params, said",
    [
        ({"page": "0"}, "page 0 is not one of 1 to"),
        ({"page": "4"}, "page 4 is not one of 1 to 3"),
        ({"page": "-1"}, "page must be a whole number"),
        ({"page": "two"}, "page must be a whole number"),
        ({"page": "1.5"}, "page must be a whole number"),
        ({"page": "١"}, "page must be a whole number"),  # an Arabic-Indic digit: int() would take it
        ({"page": "9" * 5000}, "page must be a whole number"),  # past int()'s digit limit
        ({"q": "x" * 501}, "a search (q) is at most 500 characters"),
    ],
)
def test_a_page_or_search_that_cannot_be_shown_is_a_clear_400(params, said, ndb_client, tmp_path, clock):
    site = fleet(tmp_path, ndb_client, clock, 60)
    refused = site.get("/admin/", params=params, status=400)
    assert said in refused.text


@pytest.mark.parametrize("search", ['"><script>alert(1)</script>', "％", "hourly-0\x00", " ", "'", "ℌ𝔬𝔲𝔯𝔩𝔶"])
def test_any_search_is_shown_as_text_and_finds_only_names_holding_it(search, ndb_client, tmp_path, clock):
    site = fleet(tmp_path, ndb_client, clock, 3)
    page = site.get("/admin/", params={"q": search})
    assert "<script>alert" not in page.text
    assert page.html.find(id="row-search")["value"] == search
    assert shown(page) == [f"hourly-{n:02d}" for n in range(3) if search.casefold() in f"hourly-{n:02d}"]


def home_cost(site: webtest.TestApp, counter) -> tuple[int, int]:
    """A home page's entity reads and calls, once the process has paid what it pays once."""
    site.get("/admin/")  # the schedules bound, the fence checked: what a process pays once
    counter.wait_until_idle()
    counter.reset()
    site.get("/admin/")
    counter.wait_until_idle()
    return counter.billed()["reads"], counter.total


@pytest.mark.slow  # two fleets' home pages after a day: a few seconds
def test_a_pages_reads_follow_its_rows_not_the_fleet(datastore, tmp_path, clock, monkeypatch):
    client, counter = counting_client(datastore.project, datastore.host)
    # The order from the shares' entities, never the index's queries (whose calls follow the jobs
    # that need attention, tests/test_attention.py).
    monkeypatch.setattr(attention, "_by_index", lambda now: pytest.fail("the page asked the index"))
    clock.advance(86400 + 1800)  # a day of hourly slots, none delivered; audited, so every job needs attention
    # A job's card shows its newest 48 slots and names its first 10 Scheduler jobs, whatever their number.
    costs = []
    for count in (100, 300):  # one app's database: each audits (and writes its share's entity) in turn
        site = fleet(tmp_path, client, clock, count, width=3)
        site.get("/tasks/audit", headers=CRON)
        with client.context():  # what the page reads for its order: every job, judged by the pass
            share = AttentionShare.key_for(0).get()
        assert share.count == count and len(share.jobs) == count
        costs.append(home_cost(site, counter))
    # Every job needs attention, and the page finds them in the audit shares' entities: the same
    # reads and the same calls for 100 Scheduler jobs and 300.
    assert costs[0] == costs[1]
