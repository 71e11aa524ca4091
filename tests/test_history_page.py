"""Issue 25 §2: a job's history by day, in its time zone: every slot of the day, not a sample.

A 5-minute job's day is listed slot by slot, each with the status the executions API gives
it, and its runs apart from the slots beside the ones they were near.  A per-minute job's day
is counted by the hour, and an hour drills into its slots.  Days go back and forth, a status
filter keeps what it names, and bad parameters are 400.
"""

from __future__ import annotations

import datetime
import textwrap

import pytest
import webtest

from handlers import create_app
from handlers.job_rows import ROWS_PER_PAGE
from service import hours
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    retention_seconds: 604800
  pulse:
    kind: python
    target: tests.job_targets:record
    retention_seconds: 604800
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
jobs:
  invoice-5min: {target: invoice, schedule: "*/5 * * * *", time_zone: Europe/Berlin}
  pulse-minutely: {target: pulse, schedule: "* * * * *"}
"""
SCOPE = "?project=acme-prod&location=us-central1"


@pytest.fixture
def site(datastore, ndb_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    app = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    app.get("/api/v1/scheduler-jobs")
    return app


def deliver(site, name, job, hour):
    headers = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour))
    return site.post(f"/jobs/{job}{SCOPE}", b"", headers=headers, status=200)


@pytest.mark.slow  # a whole day of slots, each compared with the API: make test runs it
def test_a_day_of_a_5_minute_job_lists_every_slot_as_the_api_says(site, clock):
    # Berlin's 2030-01-01 runs from 2029-12-31T23:00Z; the app knew the job from T0 (00:00Z).
    for minutes in range(0, 120, 5):  # 00:00Z to 01:55Z delivered on time, the rest not
        clock.advance((T0 + datetime.timedelta(minutes=minutes, seconds=5) - clock.now()).total_seconds())
        deliver(site, "invoice-5min", "invoice", minutes / 60)
    manual = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}).json["run_id"]
    # 02:30Z: a manual run is kept an hour after it finishes (its token's lifetime), so look now.
    clock.advance((T0 + datetime.timedelta(hours=2.5) - clock.now()).total_seconds())
    page = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"})
    slots = page.html.select("tr.slot-row")
    assert len(slots) == 288  # every slot of the day, none capped
    listing = site.get(
        "/api/v1/jobs/invoice/executions", params={"since": "2029-12-31T23:00:00Z", "until": "2030-01-01T23:00:00Z"}
    ).json
    assert [(tr["data-schedule-time"], tr["data-status"]) for tr in slots] == [
        (e["schedule_time"], e["status"]) for e in listing["executions"]
    ]
    statuses = [tr["data-status"] for tr in slots]
    assert statuses[:12] == ["untracked"] * 12  # 23:00Z to 23:55Z: before the app knew the schedule
    assert statuses[12:36] == ["completed"] * 24 and statuses[-1] == "upcoming"
    assert "missed" in statuses[36:] and set(statuses[36:]) <= {"missed", "due", "upcoming"}
    assert slots[12].find("td").text == "2030-01-01 01:00:00"  # in Berlin's time
    apart = page.html.select("tr.apart-row")
    assert [a.find("a")["href"].rsplit("/", 1)[1] for a in apart] == [manual]
    rows = page.html.select("#history tbody tr")
    near = rows.index(apart[0])  # beside the slot it was near: made at 01:55:05Z, Berlin 02:55:05
    assert rows[near - 1]["data-schedule-time"] == at(1 + 55 / 60) and rows[near]["data-source"] == "api"
    missed = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01", "status": "missed"}).html
    assert {tr["data-status"] for tr in missed.select("tr.slot-row")} == {"missed"}
    assert len(missed.select("tr.slot-row")) == statuses.count("missed") and not missed.select("tr.apart-row")


@pytest.mark.slow  # 1,440 slots counted by the hour: make test runs it
def test_a_per_minute_job_is_counted_by_the_hour_and_an_hour_drills_in(site, clock):
    for minute in range(3):
        clock.advance((T0 + datetime.timedelta(minutes=minute, seconds=5) - clock.now()).total_seconds())
        deliver(site, "pulse-minutely", "pulse", minute / 60)
    clock.advance((T0 + datetime.timedelta(days=2) - clock.now()).total_seconds())
    page = site.get("/admin/jobs/pulse/history", params={"day": "2030-01-01"}).html
    hours = page.select("tr.hour-row")
    assert len(hours) == 24 and page.find(id="history") is None
    counts = {
        int(tr["data-hour"]): {c["data-status"]: int(c.text.split()[-1]) for c in tr.select(".count")} for tr in hours
    }
    assert counts[0] == {"completed": 3, "missed": 57} and all(counts[h] == {"missed": 60} for h in range(1, 24))
    drilled = site.get(hours[0].find("a")["href"]).html
    assert [tr["data-status"] for tr in drilled.select("tr.slot-row")] == ["completed"] * 3 + ["missed"] * 57


def test_days_go_back_and_forth_and_the_default_is_today_in_the_jobs_zone(site, clock):
    clock.advance(23.5 * 3600)  # 23:30Z: Berlin (UTC+1 in January) is already on 2030-01-02
    page = site.get("/admin/jobs/invoice/history").html
    assert page.find("h1").text.startswith("invoice: 2030-01-02")
    assert "day=2030-01-01" in page.find(id="previous-day")["href"]
    assert "day=2030-01-03" in page.find(id="next-day")["href"]
    upcoming = {tr["data-status"] for tr in page.select("tr.slot-row")}
    assert "upcoming" in upcoming  # the rest of Berlin's day is still to come


@pytest.mark.parametrize(
    "params, words",
    [
        ({"day": "yesterday"}, "is not a date"),
        ({"day": "2030-02-30"}, "is not a date"),
        ({"hour": "24"}, "0 to 23"),
        ({"hour": "-1"}, "0 to 23"),
        ({"hour": "\u00b2"}, "0 to 23"),  # a superscript two: a digit to str.isdigit, not to int()
        ({"hour": "\u0661"}, "0 to 23"),  # an Arabic-Indic one: int() reads it; no person types it
        ({"hour": " 1"}, "0 to 23"),
        ({"hour": "1.0"}, "0 to 23"),
        ({"hour": "9" * 5000}, "0 to 23"),
        ({"day": "9999-12-31"}, "outside the schedule times"),  # its next day would overflow
        ({"day": "0001-01-01"}, "outside the schedule times"),  # its previous day would overflow
        ({"day": "1999-12-31"}, "outside the schedule times"),
        ({"day": "2100-01-01"}, "outside the schedule times"),
        ({"status": "done"}, "is none of"),
        ({"from": "soon"}, "RFC 3339"),
    ],
)
def test_bad_parameters_are_400(site, params, words):
    answer = site.get("/admin/jobs/invoice/history", params=params, status=400).json
    assert words in answer["detail"]


def test_an_unknown_job_is_404_and_the_card_links_its_history(site, clock):
    site.get("/admin/jobs/nope/history", status=404)
    clock.advance(3 * 3600)
    # The card's history is of the page's window, not of today (issue 39 §4): the same count.
    card = site.get("/admin/").html.select_one(".job-card[data-job='invoice']")
    history = site.get(card.select_one("a.history-link")["href"]).html
    summary = history.find(id="day-summary").select_one("a.expected").text
    assert summary == card.select_one("a.expected").text and "since=" in card.select_one("a.history-link")["href"]


@pytest.mark.parametrize(
    "wanted, lands",
    [
        ("a" * 64, "/admin/runs/" + "a" * 64),  # a run id: its page (which says if it is gone)
        ("A" * 64, "/admin/runs/" + "a" * 64),
        ("invoice", "/admin/jobs/invoice/history"),  # a job of jobs.yaml
        # A Scheduler job, by name or by its whole resource name: its own slots in its target's history.
        ("  pulse-minutely ", "/admin/jobs/pulse/history?scheduler_job=pulse-minutely"),
        (
            "projects/acme-prod/locations/us-central1/jobs/pulse-minutely",
            "/admin/jobs/pulse/history?scheduler_job=pulse-minutely",
        ),
    ],
)
def test_search_goes_to_what_it_names(site, wanted, lands):
    assert site.get("/admin/search", params={"q": wanted}, status=303).headers["Location"] == lands


@pytest.mark.parametrize(
    "wanted, status",
    [
        ("", 400),
        ("   ", 400),
        ("nope", 404),
        ("x" * 5000, 404),
        ("a" * 63, 404),
        # Times no slot can have (outside the keyable years): a 404 like any miss, never a 500.
        ("0001-01-01 00:00", 404),
        ("9999-12-31 23:59", 404),
        ("1999-12-31T23:59:00Z", 404),
        ("pulse 2100-06-01 00:00", 404),
    ],
)
def test_search_for_nothing_it_knows_says_so(site, wanted, status):
    answer = site.get("/admin/search", params={"q": wanted}, status=status).json
    assert answer["status"] == status and len(answer["detail"]) < 300


def test_search_finds_what_the_pages_show(site, clock, ndb_client):
    """Issue 39 §8: the 12 characters a table shows of an id, a slot time alone or after a job's
    name; an ambiguous start lists the matches; a miss keeps the query in the box."""
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    clock.advance(3600 + 30)
    run_id = deliver(site, "invoice-5min", "invoice", 1).json["run_id"]
    assert site.get("/admin/search", params={"q": run_id[:12]}, status=303).headers["Location"] == (
        f"/admin/runs/{run_id}"
    )
    assert site.get("/admin/search", params={"q": run_id[:12].upper()}, status=303)  # as a person types it
    with ndb_client.context():  # two runs whose ids share their first 12 characters
        for last in "01":
            Ledger(clock).claim_run(
                "abcdef012345" + "9" * 51 + last, RunDescription("api", "invoice"), RunPolicy(60, 3600)
            )
    both = site.get("/admin/search", params={"q": "abcdef012345"}, status=200).html
    assert len(both.select("#token-runs a")) == 2 and "2 runs match" in both.find(id="ambiguous").text
    # A slot time: alone, every Scheduler job with a slot then (both run at 01:00); after a name, its slot.
    at_once = site.get("/admin/search", params={"q": "2030-01-01 01:00"}, status=200).html
    found = {li.find("a").text: li["data-status"] for li in at_once.select("#slots-found li")}
    assert found == {"invoice-5min": "completed", "pulse-minutely": "due"}
    lands = site.get("/admin/search", params={"q": "invoice 2030-01-01T01:00:00Z"}, status=303).headers["Location"]
    assert lands == f"/admin/runs/{run_id}"
    missed = site.get("/admin/search", params={"q": "pulse-minutely 2030-01-01 00:30"}, status=303).headers["Location"]
    assert missed == "/admin/jobs/pulse/history?day=2030-01-01&hour=0&scheduler_job=pulse-minutely"
    # A miss: a page for a person, its query still in the box, saying what it was searched as.
    page = site.get("/admin/search", params={"q": "2030-01-01 00:02:30"}, headers={"Accept": "text/html"}, status=404)
    assert page.html.find(id="search")["value"] == "2030-01-01 00:02:30"
    assert "searched as" in page.html.find(id="problem-detail").text and "a slot time" in page.text


@pytest.mark.parametrize("day", ["2000-01-01", "2099-12-31"])
def test_the_first_and_last_days_kept_are_pages(site, day):
    page = site.get("/admin/jobs/invoice/history", params={"day": day}).html
    assert page.find("h1") is not None
    assert page.find(id="schedules").text == "invoice-5min: Every 5 minutes */5 * * * *"  # in words, then cron


def test_search_finds_a_manual_run_by_its_client_token(site):
    """A token is stored unindexed; the run id it makes with each job is looked up instead."""
    run_id = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "nightly-fix-4711"}).json["run_id"]
    assert (
        site.get("/admin/search", params={"q": "nightly-fix-4711"}, status=303)
        .headers["Location"]
        .endswith(f"/admin/runs/{run_id}")
    )
    site.post_json("/api/v1/jobs/pulse/runs", {"clientToken": "nightly-fix-4711"})  # the same token, another job
    both = site.get("/admin/search", params={"q": "nightly-fix-4711"}, status=200).html
    assert sorted(a.text for a in both.select("#token-runs a")) == ["invoice", "pulse"]
    site.get("/admin/search", params={"q": "never-used"}, status=404)


def test_search_shows_each_run_with_the_status_every_view_gives_it(site, clock, ndb_client):
    """Review of issue 25: the list showed the stored in_progress of a run whose lease ran out."""
    from dedup.ledger import Ledger

    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "held-token"})
    held = site.post_json("/api/v1/jobs/pulse/runs", {"clientToken": "held-token"}).json["run_id"]
    with ndb_client.context():  # make pulse's run one whose lease ran out unfinished
        record = Ledger(clock).lookup(held)
        record.status, record.lease_expires = "in_progress", clock.now()
        record.put()
    clock.advance(60)
    badges = {
        li.select_one("a").text: li.select_one(".badge").text
        for li in site.get("/admin/search", params={"q": "held-token"}).html.select("#token-runs li")
    }
    assert badges == {"invoice": "completed", "pulse": "stuck"}


def test_any_since_until_range_is_listed_slot_by_slot_and_paged(site, clock):
    clock.advance(2 * 86400)  # two days of 5-minute slots, none delivered
    since, until = "2030-01-01T00:00:00Z", "2030-01-03T00:00:00Z"
    first = site.get("/admin/jobs/invoice/history", params={"since": since, "until": until}).html
    rows = first.select("tr.slot-row")
    assert len(rows) == 288 and first.find(id="hours") is None  # paged, never counted by the hour
    assert rows[0]["data-schedule-time"] == "2030-01-01T00:00:00.000000Z"
    more = first.find(id="next-page")
    assert "since=" in more["href"] and "until=" in more["href"] and "from=" in more["href"]
    second = site.get(more["href"]).html.select("tr.slot-row")
    assert len(second) == 288 and second[-1]["data-schedule-time"] == "2030-01-02T23:55:00.000000Z"
    assert {tr["data-schedule-time"] for tr in rows}.isdisjoint(tr["data-schedule-time"] for tr in second)
    # The summary is of the whole range, on every page of it (issue 39 §4), and its counts open its slots.
    assert first.find(id="day-summary").text.startswith("576 expected")
    missed = site.get(first.select_one("#day-summary a.count[data-status='missed']")["href"]).html
    assert missed.find(id="listing-total").find("b").text == "576" and len(missed.select("tr.slot-row")) == 100
    rest = missed.find(id="next-page")["href"]
    assert len(site.get(rest).html.select("tr.slot-row")) == 100 and "from=" in rest


def test_a_run_apart_from_the_slots_is_listed_on_the_page_whose_span_holds_it(site, clock):
    """Review of issue 25: a manual run was listed on every page of a range, after slots that ended earlier."""
    clock.advance(36 * 3600)  # 2030-01-02 12:00: a manual run on the range's second day
    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}, status=201)
    clock.advance(1800)  # a manual run is kept an hour after it finishes
    since, until = "2030-01-01T00:00:00Z", "2030-01-03T00:00:00Z"
    first = site.get("/admin/jobs/invoice/history", params={"since": since, "until": until}).html
    second = site.get(first.find(id="next-page")["href"]).html
    assert first.select("tr.apart-row") == [] and len(second.select("tr.apart-row")) == 1
    empty = site.get("/admin/jobs/invoice/history", params={"since": since, "until": until, "status": "completed"})
    assert empty.html.find(id="nothing").text == "No expected execution is completed in this range."


@pytest.mark.parametrize(
    "params, words",
    [
        ({"since": "2030-01-01T00:00:00Z"}, "go together"),
        ({"until": "2030-01-01T00:00:00Z"}, "go together"),
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "come after"),
        ({"since": "2030-01-01T00:00:00Z", "until": "2030-03-01T00:00:00Z"}, "at most 31 days"),
        ({"since": "soon", "until": "2030-01-01T00:00:00Z"}, "RFC 3339"),
        ({"since": "1999-01-01T00:00:00Z", "until": "1999-01-02T00:00:00Z"}, "range"),
        ({"since": "2099-12-31T00:00:00Z", "until": "9999-12-31T00:00:00Z"}, "range"),
    ],
)
def test_a_bad_range_is_400(site, params, words):
    answer = site.get("/admin/jobs/invoice/history", params=params, status=400).json
    assert words in answer["detail"]


def test_a_day_shown_by_the_hour_offers_its_whole_bulk_run_in_one_confirmation(site, clock):
    """Issue 39 §1: a per-minute job's day has a total, and one confirmation runs its missed slots,
    saying how many and where it stops (it took one per hour before)."""
    clock.advance(86400 + 60)
    day = site.get("/admin/jobs/pulse/history", params={"day": "2030-01-01"}).html
    assert day.find(id="hours") is not None
    summary = day.find(id="day-summary")
    assert summary.select_one("a.expected").text == "1,440 expected"
    assert summary.select_one("a.count[data-status='missed']")["data-count"] == "1439"  # 23:59 is still due
    offer = day.find(id="bulk-run")
    assert offer.text.startswith("Run the 1,439 missed or failed slots of this range")
    confirm = site.get(offer["href"]).html
    facts = confirm.find(id="confirm-facts").text
    assert "1439 missed or failed slots in this range: this makes 288 runs" in facts
    assert "It stops at 2030-01-01T04:47:00.000000Z, after the oldest 288" in facts
    assert confirm.find(id="confirm-button").text == "Make these 288 runs"


FLEET_SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
jobs:
  pulse-a: {target: pulse, schedule: "* * * * *"}
  pulse-b: {target: pulse, schedule: "* * * * *"}
  pulse-c: {target: pulse, schedule: "* * * * *"}
"""


@pytest.mark.slow  # three per-minute Scheduler jobs' days counted by the hour: make test runs it
def test_an_hours_count_reads_at_most_its_cap_of_records_and_says_what_it_left_unread(
    datastore, ndb_client, tmp_path, clock, monkeypatch
):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(FLEET_SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    fleet = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    fleet.get("/api/v1/scheduler-jobs")
    deliver(fleet, "pulse-c", "pulse", 0)  # one slot of the last job ran: its summary speaks for it
    clock.advance((T0 + datetime.timedelta(days=2) - clock.now()).total_seconds())

    def counted(cap: int) -> tuple[dict[int, dict[str, int]], object]:
        monkeypatch.setattr(hours, "HOUR_LOOKUPS", cap)
        page = fleet.get("/admin/jobs/pulse/history", params={"day": "2030-01-01"}).html
        rows = page.select("tr.hour-row")
        by_hour = {
            int(tr["data-hour"]): {c["data-status"]: int(c.text.split()[-1]) for c in tr.select(".count")}
            for tr in rows
        }
        return by_hour, page.find(id="hours-unread")

    # A count with unread slots shows them, but as no link: no list of them can be made.
    monkeypatch.setattr(hours, "HOUR_LOOKUPS", 0)
    summary = fleet.get("/admin/jobs/pulse/history", params={"day": "2030-01-01"}).html.find(id="day-summary")
    assert summary.select_one(".count[data-status='unread']").name == "span"
    # Past the slots one count judges, whole Scheduler jobs are left out, and the page says how many.
    monkeypatch.setattr(hours, "HOUR_LOOKUPS", 3 * 1440)
    monkeypatch.setattr(hours, "SLOT_BUDGET", 1500)
    budgeted = fleet.get("/admin/jobs/pulse/history", params={"day": "2030-01-01"}).html
    assert budgeted.find(id="uncounted").text.startswith("2 Scheduler jobs of this range are not counted")
    assert budgeted.find(id="day-summary").select_one("a.expected").text == "1,440 expected"
    rows = fleet.get("/admin/", params={"job": "pulse"}).html.select("tr.job-row .uncounted")
    assert len(rows) == 2
    monkeypatch.setattr(hours, "SLOT_BUDGET", 100_000)
    whole, said = counted(3 * 1440)
    assert said is None and whole[0] == {"completed": 1, "missed": 179} and whole[23] == {"missed": 180}
    # Room for two jobs' records: the third's lacking slots are counted unread, whole, never guessed;
    # its one completed slot still counts from its summary.
    capped, said = counted(2 * 1440)
    assert capped[0] == {"completed": 1, "missed": 120, "unread": 59} and capped[23] == {"missed": 120, "unread": 60}
    assert "1,439 slots of 1 Scheduler job are counted as unread: more than 2,880 slots" in said.text
    assert said.find("a")["href"] == "/admin/?job=pulse"
    assert sum(sum(h.values()) for h in capped.values()) == sum(sum(h.values()) for h in whole.values())
    one, said = counted(0)  # no records at all: every lacking slot unread
    assert one[5] == {"unread": 180} and "4,319 slots of 3 Scheduler jobs" in said.text
    # A status listed, the unread are said beside it: a job of unread slots is never "missed 0".
    monkeypatch.setattr(hours, "HOUR_LOOKUPS", 2 * 1440)
    missed = fleet.get("/admin/jobs/pulse/history", params={"day": "2030-01-01", "status": "missed"}).html
    said = missed.find(id="listing-total").text
    assert said.startswith("2,880 slots are missed in this range: 100 on this page.")
    assert "1,439 slots went unread" in said
    # Today's slots still to come are counted upcoming without a read: they take none of the cap.
    clock.advance((T0 + datetime.timedelta(days=2, minutes=30) - clock.now()).total_seconds())
    # 00:00 to 00:31 of each job: the half hour past, and the next minute (whose delivery may have come).
    monkeypatch.setattr(hours, "HOUR_LOOKUPS", 3 * 32)
    today = fleet.get("/admin/jobs/pulse/history", params={"day": "2030-01-03"}).html
    assert today.find(id="hours-unread") is None
    first = today.find("tr", attrs={"data-hour": "0"})
    counts = {c["data-status"]: int(c.text.split()[-1]) for c in first.select(".count")}
    assert counts["upcoming"] >= 3 * 28 and sum(counts.values()) == 180 and "unread" not in counts


def test_an_hours_count_reads_no_more_records_than_a_home_page_may():
    assert hours.HOUR_LOOKUPS == ROWS_PER_PAGE * 288  # a page of rows of a 5-minute job's day each


def test_a_rows_counts_open_its_own_scheduler_job_where_one_name_has_two_scopes(datastore, ndb_client, tmp_path, clock):
    """Review of issue 39: a row's links named its Scheduler job by name alone, so two of one name in
    two locations were listed together; the scope rides with the name."""
    (tmp_path / "scheduler.yaml").write_text(
        textwrap.dedent("""
        defaults: {project: acme-prod, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
        jobs:
          nightly-us: {name: nightly, target: invoice, schedule: "0 * * * *", location: us-central1}
          nightly-eu: {name: nightly, target: invoice, schedule: "30 * * * *", location: europe-west1}
        """)
    )
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    fleet = webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))
    clock.advance(6 * 3600)
    rows = fleet.get("/admin/").html.select("tr.job-row[data-scheduler-job='nightly']")
    assert len(rows) == 2
    for row in rows:
        missed = fleet.get(row.select_one("a.count[data-status='missed']")["href"]).html
        times = {tr["data-schedule-time"][14:16] for tr in missed.select("tr.slot-row")}
        assert (
            len(times) == 1
            and missed.find(id="listing-total").find("b").text
            == row.select_one("a.count[data-status='missed']")["data-count"]
        )


def test_the_runs_list_pages_20_at_a_time_and_keeps_its_window_while_paging(site, clock):
    """Issue 39 §3: the runs list is paged (20 a page) with a cursor; the later page keeps the
    bounds of the first, though the last 24 hours moved on meanwhile; bad cursors are 400s."""
    for index in range(25):
        clock.advance(1)
        site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": f"paged-{index}"}, status=201)
    first = site.get("/admin/").html
    ids = [tr.select_one("a")["href"] for tr in first.select("tr.run-row")]
    assert len(ids) == 20 and first.find(id="runs-first") is None
    clock.advance(600)
    second = site.get(first.find(id="runs-next")["href"]).html
    more = [tr.select_one("a")["href"] for tr in second.select("tr.run-row")]
    assert len(more) == 5 and set(more).isdisjoint(ids) and second.find(id="runs-next") is None
    assert second.find(id="runs-first") is not None
    site.get("/admin/", params={"runs_from": "not-a-cursor"}, status=400)
    site.get("/admin/", params={"runs_from": "x", "runs_until": "yesterday"}, status=400)
