"""Issue 37 §1: the home page's queries are issued together, so its round trips do not grow with
the fleet.

Each card's newest runs and its runs in progress were two queries a job, one after another, and
each card's slots a lookup of their own: a view of 200 jobs was about 800 sequential calls.  Now
every card's queries go at once, every card's slots are one lookup, and a lookup of more keys
than one request takes sends its batches at once.  Counted on the wire, one round trip away.
"""

from __future__ import annotations

import textwrap
import time

import pytest
import webtest

from devtools.latency_proxy import DelayingProxy
from devtools.rpc_counter import counting_client
from handlers import create_app

CRON = {"X-Appengine-Cron": "true"}
ROUND_TRIP_MS = 40  # long against the time Python takes between two sends


@pytest.fixture
def slow_client(datastore):
    host, port = datastore.host.rsplit(":", 1)
    with DelayingProxy(host, int(port), ROUND_TRIP_MS / 2) as proxy:
        yield counting_client(datastore.project, proxy.host)


def fleet_site(tmp_path, client, clock, jobs: int) -> webtest.TestApp:
    folder = tmp_path / f"fleet-{jobs}"
    folder.mkdir()
    (folder / "jobs.yaml").write_text(
        "jobs:\n" + "".join(f"  job-{n}: {{kind: python, target: tests.job_targets:record}}\n" for n in range(jobs))
    )
    (folder / "scheduler.yaml").write_text(
        textwrap.dedent("""
        defaults: {project: acme-prod, location: us-central1, attempt_deadline: 60s, start_at: "2030-01-01T00:00:00Z"}
        jobs:
        """)
        # Every five minutes: a day's 288 slots a Scheduler job, over a thousand keys for the fleet.
        + "".join(f"  every-5-{n}: {{target: job-{n}, schedule: '*/5 * * * *'}}\n" for n in range(jobs))
    )
    return webtest.TestApp(create_app(jobs_file=str(folder / "jobs.yaml"), clock=clock, ndb_client=client))


def home_round_trips(site: webtest.TestApp, counter) -> int:
    """The fewest of three views: a thread descheduled between two sends on a loaded machine makes
    calls sent together look sequential, and only ever adds a round trip."""
    site.get("/admin/")  # the schedules bound, the fence checked: what a page pays once per process
    counts = []
    for _ in range(3):
        counter.wait_until_idle()
        counter.reset()
        site.get("/admin/")
        answered = time.monotonic()
        counts.append(counter.sequential_round_trips(until=answered))
    return min(counts)


@pytest.mark.slow  # two fleets' home pages, one round trip away: a few seconds
def test_the_home_page_costs_as_many_round_trips_for_eight_jobs_as_for_two(slow_client, tmp_path, clock):
    client, counter = slow_client
    clock.advance(86400)  # a day of slots, none delivered
    trips = []
    for jobs in (2, 8):
        site = fleet_site(tmp_path, client, clock, jobs)
        # Audited, as cron does every 15 minutes: the order then comes from the share's entity. (Before
        # any pass, the index answers instead: one round trip more, schedules.attention.)
        site.get("/tasks/audit", headers=CRON)
        trips.append(home_round_trips(site, counter))
    assert trips[0] == trips[1] <= 8
