"""Issue 35 §3, F5: every time a request carries is held to one documented range, by one parser.

``from=9999-12-31T23:59:00Z`` on the history page and the bulk run's confirmation was a 500
(an ``OverflowError``: the page's arithmetic went past year 9999), and the run API took any
year at all.  The class: every route that reads a time (query parameters, form fields, a
path's schedule time, a task's JSON body, the Scheduler header), each sent the extremes:
year 1, year 9999 at the end of its day, values a day's arithmetic either side overflows,
offsets that carry them past either end, and the first instants outside the range
docs/limits.md gives.  Each answers 400 naming the field, never a 5xx; the edges inside it
are served.
"""

from __future__ import annotations

import textwrap
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.deliveries import scheduler_headers
from tests.support.schedule_sites import at
from tests.test_history_page import JOBS, SCHEDULES  # a 5-minute job in Berlin, a per-minute one

OUTSIDE = [
    "0001-01-01T00:00:00Z",  # year 1: a day before it overflows
    "0001-01-01T00:00:00+23:59",  # an offset that carries it before year 1
    "9999-12-31T00:00:00Z",
    "9999-12-31T23:59:00Z",  # the end of year 9999's last day: a day after it overflows
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59-23:59",  # an offset that carries it past year 9999
    "9999-12-31T23:59:59+23:59",
    "1999-12-31T23:59:59.999999Z",  # the last instant before the range
    "2100-01-01T00:00:00Z",  # the range's end, not included
    "2099-12-31T23:00:00-01:00",  # the range's end again, by its offset
    "2000-01-01T00:00:00+23:59",  # 1999-12-31T00:01Z: before the range, by its offset
]
MALFORMED = [
    "2030-01-01T00:00:00+99:00",  # an offset of days
    "2030-01-01T00:00:00-24:00",
    "2030-01-01T00:00:00",  # no offset
    "99999-01-01T00:00:00Z",
    "soon",
]
INSIDE = [  # the range's edges, and instants a day from them: served, whatever the page makes of them
    "2000-01-01T00:00:00Z",
    "2000-01-01T00:00:00-00:00",
    "2099-12-31T23:59:59.999999Z",
    "2099-12-31T23:59:59-00:00",
]
SLOT_LINE = "{} invoice-5min acme-prod us-central1 0"
RANGE = {"since": "2030-01-01T00:00:00Z", "until": "2030-01-02T00:00:00Z"}
HISTORY = "/admin/jobs/invoice/history"
BULK = "/admin/jobs/invoice/history/run"
QUEUE = {"X-AppEngine-QueueName": "dedup-runs"}
SLOT_FORM = {"scheduler_job": "invoice-5min", "project": "acme-prod", "location": "us-central1", "attempt": "0"}


def path_time(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# Every route that reads a time: the field it names, and the request that carries ``value`` in it.
Send = Callable[[Any, str], Any]
ROUTES: dict[str, tuple[str, Send]] = {
    "history page, from (a day)": ("from", lambda s, v: s.get(HISTORY, {"day": "2030-01-01", "from": v}, status="*")),
    "history page, from (a range)": ("from", lambda s, v: s.get(HISTORY, {**RANGE, "from": v}, status="*")),
    "history page, since": ("since", lambda s, v: s.get(HISTORY, {"since": v, "until": RANGE["until"]}, status="*")),
    "history page, until": ("until", lambda s, v: s.get(HISTORY, {"since": RANGE["since"], "until": v}, status="*")),
    "bulk confirmation, from": (
        "from",
        lambda s, v: s.get(BULK, {"day": "2030-01-01", "hour": "3", "from": v}, status="*"),
    ),
    "bulk confirmation, since": ("since", lambda s, v: s.get(BULK, {"since": v, "until": RANGE["until"]}, status="*")),
    "bulk confirmation, until": ("until", lambda s, v: s.get(BULK, {"since": RANGE["since"], "until": v}, status="*")),
    "bulk run form, a slot": ("schedule_time", lambda s, v: s.post(BULK, {"slots": SLOT_LINE.format(v)}, status="*")),
    "bulk run form, from": (
        "from",
        lambda s, v: s.post(BULK, {"slots": SLOT_LINE.format(at(1)), "day": "2030-01-01", "from": v}, status="*"),
    ),
    "bulk run form, since": (
        "since",
        lambda s, v: s.post(
            BULK, {"slots": SLOT_LINE.format(at(1)), "since": v, **{"until": RANGE["until"]}}, status="*"
        ),
    ),
    "bulk run form, until": (
        "until",
        lambda s, v: s.post(BULK, {"slots": SLOT_LINE.format(at(1)), "since": RANGE["since"], "until": v}, status="*"),
    ),
    "slot run confirmation": (
        "schedule_time",
        lambda s, v: s.get(f"/admin/jobs/invoice/executions/{path_time(v)}/run", SLOT_FORM, status="*"),
    ),
    "slot run form": (
        "schedule_time",
        lambda s, v: s.post(f"/admin/jobs/invoice/executions/{path_time(v)}/run", SLOT_FORM, status="*"),
    ),
    "executions API, since": ("since", lambda s, v: s.get("/api/v1/jobs/invoice/executions", {"since": v}, status="*")),
    "executions API, until": ("until", lambda s, v: s.get("/api/v1/jobs/invoice/executions", {"until": v}, status="*")),
    "executions API, a slot run": (
        "schedule_time",
        lambda s, v: s.post(f"/api/v1/jobs/invoice/executions/{path_time(v)}/run", status="*"),
    ),
    "run API, since": ("since", lambda s, v: s.get("/api/v1/runs", {"since": v}, status="*")),
    "run API, until": ("until", lambda s, v: s.get("/api/v1/runs", {"until": v}, status="*")),
    "a dispatched slot run's body": (
        "schedule_time",
        lambda s, v: s.post_json(
            "/tasks/run-slot",
            {**SLOT_FORM, "attempt": 0, "job_id": "invoice", "schedule_time": v, "requested_by": "local"},
            headers=QUEUE,
            status="*",
        ),
    ),
    "a Scheduler delivery": (
        "X-CloudScheduler-ScheduleTime",
        lambda s, v: s.post(
            "/jobs/invoice?project=acme-prod&location=us-central1",
            b"",
            headers=scheduler_headers(scheduler_job_name="invoice-5min", schedule_time=v),
            status="*",
        ),
    ),
}


@pytest.fixture
def site(make_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    app = make_client(JOBS)
    app.get("/api/v1/scheduler-jobs")  # the app knows the schedule from 2030-01-01T00:00Z
    clock.advance(86400 + 60)
    return app


def refusal(answer) -> tuple[int, str, str | None]:
    """The status a request was answered with, what a refusal says, and the field its problem
    names: a dispatched task's answer is settled (200, the answer inside); a page's is HTML."""
    if answer.content_type == "application/json" and answer.json.get("settled"):
        inside = answer.json["answer"]
        return answer.json["status"], inside.get("detail", "") if isinstance(inside, dict) else "", None
    if answer.status_int < 400:
        return answer.status_int, "", None
    if answer.content_type == "text/html":
        return answer.status_int, answer.html.find(id="problem").text, None
    return answer.status_int, answer.json["detail"], answer.json.get("field")


@pytest.mark.parametrize("route", ROUTES)
def test_a_time_outside_the_range_is_a_400_naming_its_field(site, route):
    field, send = ROUTES[route]
    for value in OUTSIDE + MALFORMED:
        status, said, named = refusal(send(site, value))
        assert status == 400, f"{value}: {status} {said[:300]}"
        assert said.startswith(f"{field} ") or f" {field} " in said, f"{value}: {said[:300]}"
        if route != "a Scheduler delivery":  # its header's own words are dedup.keys' (docs/contract.md)
            assert "RFC 3339" in said and "2000-01-01T00:00:00Z" in said and "2100-01-01T00:00:00Z" in said, said
        assert named in (None, field)  # a problem of the API names it as a member too


@pytest.mark.parametrize("route", ROUTES)
def test_the_edges_inside_the_range_are_served(site, route):
    _, send = ROUTES[route]
    for value in INSIDE:
        status, said, _ = refusal(send(site, value))
        assert status < 500, f"{value}: {status} {said[:300]}"
