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

import pytest
import webtest
from google.cloud import ndb

from handlers import create_app
from models.delivery_tally import TALLY_HOURS, DeliveryTally
from schedules import tallies
from schedules.tallies import duplicates_in, hours_between, tally_duplicate, tally_keys
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


def test_a_duplicate_in_progress_is_counted_too(site, clock, ndb_client):
    from dedup.keys import scheduled_run_key
    from dedup.ledger import Ledger, RunDescription, RunPolicy

    clock.advance(3600 + 10)
    key = scheduled_run_key("invoice-hourly", at(1), query_project="acme-prod", query_location="us-central1")
    description = RunDescription(
        "scheduler", "invoice", "invoice-hourly", key.schedule_time, project="acme-prod", location="us-central1"
    )
    with ndb_client.context():
        Ledger(clock).claim_run(key.run_id, description, RunPolicy(60, 604800))  # another attempt holds it
    assert deliver(site, "invoice-hourly", 1).status_int == 409
    assert row(site, "invoice-hourly").select_one(".duplicates")["data-count"] == "1"


def test_a_count_that_cannot_be_written_never_touches_the_answer(site, clock, monkeypatch, caplog):
    clock.advance(3600 + 10)
    deliver(site, "invoice-hourly", 1)

    def refuse(scheduler_job, schedule_time):
        raise RuntimeError("Datastore is gone")

    monkeypatch.setattr(tallies, "tally_duplicate", refuse)
    with caplog.at_level(logging.WARNING, logger="schedules.tallies"):
        answer = deliver(site, "invoice-hourly", 1)
    assert answer.status_int == 200 and answer.json["status"] == "completed"
    assert "went uncounted" in caplog.text
    assert row(site, "invoice-hourly").select_one(".duplicates")["data-count"] == "0"


def test_the_ring_counts_each_hour_once_and_never_an_hour_it_moved_past(datastore, ndb_client):
    job = "acme-prod/us-central1/invoice-hourly"
    hour = datetime.datetime(2030, 1, 1, 5, tzinfo=datetime.UTC)
    later = hour + datetime.timedelta(hours=TALLY_HOURS)  # the same bucket, a ring later
    with ndb_client.context():
        tally_duplicate(job, hour + datetime.timedelta(minutes=30))
        tally_duplicate(job, hour)
        assert DeliveryTally.key_for(job, hour) == DeliveryTally.key_for(job, later)

        def read(*hours):
            keys = tally_keys(job, hours)
            return duplicates_in(dict(zip(keys, ndb.get_multi(keys), strict=True)), job, hours)

        assert read(hour) == 2 and read(later) == 0
        tally_duplicate(job, later)  # the bucket moves on to the newer hour, starting at 0
        assert read(later) == 1 and read(hour) == 0
        tally_duplicate(job, hour)  # a duplicate of a slot older than the ring: not counted, nothing reset
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
