"""Issue 25 §1: deliveries against runs, "24 expected · 24 ran once · 9 duplicate deliveries absorbed".

A duplicate delivery (its slot's run done, or running) is counted after its answer has gone
(schedules.tallies, through the response's close), in a ring of hourly buckets per
Scheduler job; the home row sums the buckets of its day's slots.  A Force run, a manual run
and the first delivery are not duplicates.  A count that cannot be written is let go: the
duplicate's answer never depends on it.
"""

from __future__ import annotations

import datetime
import logging
import textwrap
from pathlib import Path

import pytest
import webtest
from google.cloud import ndb

from handlers import create_app
from models.delivery_tally import TALLY_HOURS, DeliveryTally
from schedules import tallies
from schedules.tallies import (
    DELIVERIES_LISTED,
    DuplicateDelivery,
    SlotDeliveries,
    deliveries_of_slot,
    duplicates_in,
    hours_between,
    tally_duplicate,
    tally_keys,
)
from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import T0, at

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
    retention_seconds: 604800
"""
SCHEDULES = """
defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
jobs:
  invoice-hourly: {target: invoice, schedule: "0 * * * *"}
  other-hourly: {target: invoice, schedule: "30 * * * *"}
"""
SCOPE = "?project=acme-prod&location=us-central1"


@pytest.fixture
def site(datastore, ndb_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(JOBS))
    return webtest.TestApp(create_app(jobs_file=str(tmp_path / "jobs.yaml"), clock=clock, ndb_client=ndb_client))


def deliver(site, name: str, hour: float, **headers: str):
    sent = scheduler_headers(scheduler_job_name=name, schedule_time=at(hour), **headers)
    return site.post(f"/jobs/invoice{SCOPE}", b"", headers=sent, status="*")


def row(site, name: str):
    return site.get("/admin/").html.select_one(f"tr.job-row[data-scheduler-job='{name}']")


def test_a_row_says_its_runs_and_the_duplicates_they_absorbed(site, clock):
    clock.advance(3 * 3600 + 10)  # 03:00:10: three slots of each job are due
    for hour in (0, 1, 2):
        assert deliver(site, "invoice-hourly", hour).status_int == 200  # each slot runs once
    for _ in range(3):  # Scheduler delivers 00:00 three times more, and 02:00 twice
        assert deliver(site, "invoice-hourly", 0).status_int == 200
    for _ in range(2):
        assert deliver(site, "invoice-hourly", 2).status_int == 200
    assert deliver(site, "other-hourly", 0.5).status_int == 200  # the other job's one delivery
    invoice, other = row(site, "invoice-hourly"), row(site, "other-hourly")
    assert invoice.select_one(".ran-once").text == "3 ran once"
    assert invoice.select_one(".duplicates")["data-count"] == "5"
    assert other.select_one(".ran-once").text == "1 ran once" and other.select_one(".duplicates")["data-count"] == "0"
    assert "a floor" in site.get("/admin/").html.find(id="duplicates-note").text


def test_a_force_run_and_a_manual_run_are_not_duplicates(site, clock):
    clock.advance(3600 + 10)
    deliver(site, "invoice-hourly", 1)
    clock.advance(600)  # 01:10: an operator's Force run carries its own time, no slot's
    forced = [deliver(site, "invoice-hourly", 1 + 10 / 60) for _ in range(2)]  # and Scheduler retries it
    assert forced[1].json["duplicate"] is True and forced[1].json["run_id"] == forced[0].json["run_id"]
    manual = [site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}) for _ in range(2)]
    assert manual[0].json["run_id"] == manual[1].json["run_id"]  # the manual run's own retry
    invoice = row(site, "invoice-hourly")
    assert (
        invoice.select_one(".duplicates")["data-count"] == "0" and invoice.select_one(".ran-once").text == "1 ran once"
    )


def hold_slot(ndb_client, clock, hour: float) -> str:
    """Claim invoice-hourly's slot as another attempt would, and hold it: the run id."""
    from dedup.keys import scheduled_run_key
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    key = scheduled_run_key("invoice-hourly", at(hour), query_project="acme-prod", query_location="us-central1")
    description = RunDescription(
        "scheduler", "invoice", "invoice-hourly", key.schedule_time, project="acme-prod", location="us-central1"
    )
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 604800))
    return key.run_id


def test_a_duplicate_in_progress_is_counted_too(site, clock, ndb_client):
    clock.advance(3600 + 10)
    hold_slot(ndb_client, clock, 1)
    assert deliver(site, "invoice-hourly", 1).status_int == 409
    assert row(site, "invoice-hourly").select_one(".duplicates")["data-count"] == "1"


def test_a_count_that_cannot_be_written_never_touches_the_answer(site, clock, monkeypatch, caplog):
    clock.advance(3600 + 10)
    deliver(site, "invoice-hourly", 1)

    def refuse(scheduler_job, schedule_time, delivery):
        raise RuntimeError("Datastore is gone")

    monkeypatch.setattr(tallies, "tally_duplicate", refuse)
    with caplog.at_level(logging.WARNING, logger="schedules.tallies"):
        answer = deliver(site, "invoice-hourly", 1)
    assert answer.status_int == 200 and answer.json["status"] == "completed"
    assert "went uncounted" in caplog.text
    assert row(site, "invoice-hourly").select_one(".duplicates")["data-count"] == "0"


def test_the_ring_counts_each_hour_once_and_never_an_hour_it_moved_past(datastore, ndb_client, monkeypatch):
    job = "acme-prod/us-central1/invoice-hourly"
    hour = datetime.datetime(2030, 1, 1, 5, tzinfo=datetime.UTC)
    later = hour + datetime.timedelta(hours=TALLY_HOURS)  # the same bucket, a ring later
    seen = DuplicateDelivery(hour, "i-1", 200)
    monkeypatch.setattr(tallies, "tally_duplicate", lambda job, time: tally_duplicate(job, time, seen))
    with ndb_client.context():
        tallies.tally_duplicate(job, hour + datetime.timedelta(minutes=30))
        tallies.tally_duplicate(job, hour)
        assert DeliveryTally.key_for(job, hour) == DeliveryTally.key_for(job, later)

        def read(*hours):
            keys = tally_keys(job, hours)
            return duplicates_in(dict(zip(keys, ndb.get_multi(keys), strict=True)), job, hours)

        assert read(hour) == 2 and read(later) == 0
        tallies.tally_duplicate(job, later)  # the bucket moves on to the newer hour, starting at 0
        assert read(later) == 1 and read(hour) == 0
        tallies.tally_duplicate(job, hour)  # a duplicate of a slot older than the ring: not counted, nothing reset
        assert read(later) == 1 and read(hour) == 0
        assert read(*hours_between(hour, later)) == 1


def test_hours_between_takes_both_ends():
    first = datetime.datetime(2030, 1, 1, 5, 30, tzinfo=datetime.UTC)
    assert hours_between(first, first + datetime.timedelta(hours=2)) == [
        T0 + datetime.timedelta(hours=h) for h in (5, 6, 7)
    ]


def poll_until(condition, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.live
def test_on_gunicorn_every_duplicate_is_counted_or_said_uncounted(emulator, datastore, tmp_path):
    """32 deliveries of one slot at once through a real gunicorn: one runs, 31 are duplicates.
    Each is counted behind its answer (the response's close, as gunicorn calls it), or, where
    its bucket was too contended, logged as uncounted: none is lost silently."""
    import concurrent.futures
    import threading

    import requests
    from bs4 import BeautifulSoup

    from tests.support.live import serving

    slot_time = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:00Z")  # this minute's slot
    (tmp_path / "scheduler.yaml").write_text(
        textwrap.dedent(f"""
        defaults: {{project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "{slot_time}"}}
        jobs:
          every-minute: {{target: invoice, schedule: "* * * * *"}}
        """)
    )
    log_path = tmp_path / "app.log"
    with serving(emulator, tmp_path, JOBS, log_path=str(log_path)) as server:
        barrier = threading.Barrier(32)

        def one(_):
            barrier.wait()
            headers = scheduler_headers(scheduler_job_name="every-minute", schedule_time=slot_time)
            return requests.post(f"{server.url}/jobs/invoice{SCOPE}", headers=headers, timeout=30)

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, range(32)))
        assert sorted({a.status_code for a in answers}) <= [200, 409]
        fresh = [a for a in answers if a.status_code == 200 and not a.json()["duplicate"]]
        contended = [a for a in answers if a.status_code == 409 and a.json()["error"] == "RunContended"]
        duplicates = len(answers) - len(fresh) - len(contended)  # a contended claim found no run: no duplicate
        assert len(fresh) == 1

        def counted() -> int:  # the counts are written behind the answers: some may still be on their way
            page = requests.get(f"{server.url}/admin/", headers={"X-Appengine-User-Is-Admin": "1"}, timeout=30)
            row = BeautifulSoup(page.text, "html.parser").select_one("tr.job-row[data-scheduler-job='every-minute']")
            return int(row.select_one(".duplicates")["data-count"])

        settled = poll_until(lambda: counted() + log_path.read_text().count("went uncounted") == duplicates, 20)
        seen = (counted(), log_path.read_text().count("went uncounted"), duplicates)
    assert settled and seen[0] > 0, seen


def test_a_runs_page_says_the_duplicates_its_slot_absorbed(site, clock):
    clock.advance(2 * 3600 + 10)
    first = deliver(site, "invoice-hourly", 0).json["run_id"]
    for _ in range(3):
        deliver(site, "invoice-hourly", 0)
    second = deliver(site, "invoice-hourly", 1).json["run_id"]
    manual = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}).json["run_id"]
    assert site.get(f"/admin/runs/{first}").html.find(id="duplicates").text.startswith("3 absorbed")
    assert site.get(f"/admin/runs/{second}").html.find(id="duplicates").text.startswith("0 absorbed")
    assert site.get(f"/admin/runs/{manual}").html.find(id="duplicates") is None  # no slot, no deliveries
    clock.advance(48 * 3600)  # the ring has moved past 00:00's hour
    assert site.get(f"/admin/runs/{first}").html.find(id="duplicates").text == "not kept past 48 hours"


def deliveries_table(site, run_id: str) -> list[tuple[str, str, str]]:
    rows = site.get(f"/admin/runs/{run_id}").html.select("#deliveries tbody tr")
    return [(row["class"][0], row.select("td")[1].text, row.select("td")[2].text) for row in rows]


def test_a_runs_page_lists_each_delivery_it_received(site, clock, ndb_client):
    """§4: the deliveries a run received, oldest first: the one that ran it, then each duplicate
    with when it came, where it was answered and what it was told."""
    from dedup.claims import INSTANCE

    clock.advance(3600 + 10)
    first = deliver(site, "invoice-hourly", 1).json["run_id"]
    clock.advance(5)
    deliver(site, "invoice-hourly", 1)
    clock.advance(5)
    deliver(site, "invoice-hourly", 1)
    listed = deliveries_table(site, first)
    assert [kind for kind, _, _ in listed] == ["attempt", "duplicate", "duplicate"]
    assert listed[0][2] == "ran attempt 1: completed"
    assert {answer for _, _, answer in listed[1:]} == {"200: found it done, ran nothing"}
    assert {instance for _, instance, _ in listed} == {INSTANCE}
    times = site.get(f"/admin/runs/{first}").html.select("#deliveries tbody tr td:first-child time")
    stamps = [t["datetime"] for t in times]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3  # each its own time, in order
    assert "more duplicate deliveries" not in site.get(f"/admin/runs/{first}").html.find(id="deliveries-note").text


def test_a_duplicate_that_found_the_run_running_is_listed_as_told_409(site, clock, ndb_client):
    clock.advance(3600 + 10)
    run_id = hold_slot(ndb_client, clock, 1)
    assert deliver(site, "invoice-hourly", 1).status_int == 409
    listed = deliveries_table(site, run_id)
    assert [(kind, answer) for kind, _, answer in listed] == [
        ("attempt", "ran attempt 1: running"),
        ("duplicate", "409: found it running, ran nothing (Cloud Scheduler retries it)"),
    ]


def test_past_the_listed_few_duplicates_are_counted_and_the_page_says_how_many(site, clock):
    clock.advance(3600 + 10)
    first = deliver(site, "invoice-hourly", 1).json["run_id"]
    for _ in range(DELIVERIES_LISTED + 3):
        deliver(site, "invoice-hourly", 1)
    page = site.get(f"/admin/runs/{first}").html
    assert page.find(id="duplicates").select_one("[data-count]")["data-count"] == str(DELIVERIES_LISTED + 3)
    assert len(page.select("#deliveries tr.duplicate")) == DELIVERIES_LISTED
    assert page.find(id="deliveries-note").text.startswith("3 more duplicate deliveries were counted and not listed")
    manual = Path("docs/seeing-runs.md").read_text().replace("\n  ", " ")
    assert f"lists its first {DELIVERIES_LISTED} duplicates" in manual


def test_a_manual_runs_page_lists_its_attempts_and_says_retries_are_not_listed(site, clock):
    manual = site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}).json["run_id"]
    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"})
    page = site.get(f"/admin/runs/{manual}").html
    assert [row["class"][0] for row in page.select("#deliveries tbody tr")] == ["attempt"]
    assert "is not listed" in page.find(id="deliveries-note").text


@pytest.mark.parametrize(
    ("stored", "count", "readable"),
    [
        (None, 0, 0),
        (7, 7, 0),  # the first form: a bare count, nothing listed
        ("seven", 0, 0),
        ([1, 2], 0, 0),
        ({"n": "many", "seen": "x"}, 0, 0),
        ({"n": 2, "seen": [["not a time", "i", 200], ["2030-01-01T00:00:00Z"], None, {"a": 1}]}, 2, 0),
        ({"n": 2, "seen": [["2030-01-01T00:00:00.000000Z", "i-1", "409"], ["2030-01-01T00:00:01Z", "i", "x"]]}, 2, 1),
    ],
)
def test_whatever_a_slot_holds_reads_as_a_count_and_the_deliveries_it_can_read(stored, count, readable):
    """A bucket written by an older form of this code, or damaged, never breaks a run's page:
    what cannot be read is left out, and counting goes on from it."""
    kept = SlotDeliveries.from_stored(stored)
    assert kept.count == count and len(kept.listed) == readable
    again = SlotDeliveries.from_stored(kept.plus(DuplicateDelivery(T0, "i-3", 200)))
    assert again.count == count + 1 and again.listed[-1] == DuplicateDelivery(T0, "i-3", 200)


def test_a_slot_of_the_first_form_keeps_its_count_when_counted_again(datastore, ndb_client):
    job = "acme-prod/us-central1/invoice-hourly"
    hour = datetime.datetime(2030, 1, 1, 5, tzinfo=datetime.UTC)
    with ndb_client.context():
        DeliveryTally(
            key=DeliveryTally.key_for(job, hour), hour=hour, duplicates=4, by_slot={"2030-01-01T05:00:00.000000Z": 4}
        ).put()
        tally_duplicate(job, hour, DuplicateDelivery(hour, "i-1", 200))
        kept = deliveries_of_slot(job, hour, hour + datetime.timedelta(minutes=1))
    assert kept == SlotDeliveries(5, (DuplicateDelivery(hour, "i-1", 200),))


def test_a_slot_that_took_two_attempts_is_not_counted_as_ran_once(site, clock, ndb_client):
    """Review of issue 25: a slot taken over after its lease ran out called downstream twice, so
    the row says it completed after more than one attempt instead of "ran once"."""
    clock.advance(2 * 3600 + 10)
    hold_slot(ndb_client, clock, 0)  # an attempt that claimed 00:00 and then went silent
    deliver(site, "invoice-hourly", 1)
    clock.advance(61)  # its 60 s lease has run out
    assert deliver(site, "invoice-hourly", 0).json["attempt"] == 2  # a takeover completes it
    invoice = row(site, "invoice-hourly")
    assert invoice.select_one(".ran-once").text == "1 ran once"
    assert invoice.select_one(".ran-more")["data-count"] == "1"
    summary = site.get("/admin/jobs/invoice/history", params={"day": "2030-01-01"}).html.find(id="day-summary")
    assert "1 ran once" in summary.text and "1 completed after more than one attempt" in summary.text
