"""Issue 25 §8: the operator's question on a generated week of a 5-minute job with every fault.

devtools/week.py delivers 2,016 slots through the app (duplicates, permanent failures,
released runs Scheduler's retry completes, late deliveries, undelivered slots, a pause, a
stuck run).  Then the page must answer "did last night run, once each?" as the plan says:
last night's history lists every slot with the status it was made to end as, and the home
row counts the day's runs and the duplicates they absorbed.  `make screenshots` takes the
pictures docs/seeing-runs.md shows from the same week; here they go to a temporary folder.
"""

from __future__ import annotations

import datetime
import shutil
from collections import Counter

import pytest
import webtest

from devtools import week

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow  # a week of deliveries (about a minute): make test runs it
def test_a_generated_week_answers_the_operators_question(google, ndb_client, tmp_path, monkeypatch):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)  # the pause, in Cloud Scheduler's stand-in
    app, clock = week.build_week(tmp_path / "week", ndb_client)
    site = webtest.TestApp(app)
    sunday = (clock.now() - datetime.timedelta(days=1)).date().isoformat()
    night = site.get("/admin/jobs/invoice/history", params={"day": sunday}).html
    listed = Counter(tr["data-status"] for tr in night.select("tr.slot-row"))
    assert listed == week.expected_counts(6) and sum(listed.values()) == 288
    assert listed["failed"] and listed["missed"] and listed["skipped"] and listed["completed"]
    summary = night.find(id="day-summary")  # the answer at a glance
    sunday_slots = [s for s in week.plan() if s.index // 288 == 6]
    once, more = week.ran_once_or_more(sunday_slots)
    assert once + more == listed["completed"] and more > 0  # the released slots took two attempts
    assert summary.find("b").text == f"288 expected · {once} ran once"
    assert summary.select_one(".ran-more").text == f"{more} completed after more than one attempt"
    assert {c["data-status"]: int(c.text.split()[-1]) for c in summary.select(".count")} == {
        status: n for status, n in listed.items() if status != "completed"
    }
    # The home row: the last 24 hours of slots, each run once, and the duplicates they absorbed.
    now = clock.now()
    day = [slot for slot in week.plan() if now - datetime.timedelta(hours=24) < slot.schedule_time <= now]
    row = site.get("/admin/").html.select_one("tr.job-row[data-scheduler-job='invoice-5min']")
    assert row.select_one(".ran-once").text == f"{week.ran_once_or_more(day)[0]} ran once"
    assert int(row.select_one(".duplicates")["data-count"]) == sum(s.duplicates for s in day) > 0
    counts = {c["data-status"]: int(c.text.split()[-1]) for c in row.select(".count")}
    assert counts["failed"] == sum(s.ends_as == "failed" for s in day) and row["data-attention"] == "yes"
    # Each slot ran once: one run per slot that was delivered and not skipped, none twice.
    listing = site.get(
        "/api/v1/jobs/invoice/executions", params={"since": f"{sunday}T00:00:00Z", "until": f"{sunday}T23:59:59Z"}
    ).json
    attempts = [e["run"]["attempt"] for e in listing["executions"] if e.get("run")]
    planned = {s.schedule_time: s for s in week.plan() if s.index // 288 == 6}
    for e in listing["executions"]:
        slot = planned[datetime.datetime.fromisoformat(e["schedule_time"].replace("Z", "+00:00"))]
        if e.get("run"):
            assert e["run"]["attempt"] == slot.attempts, e  # released then completed: 2; too late: none
    assert len(attempts) == sum(s.fault not in ("undelivered", "paused") for s in planned.values())
    if CHROMIUM is None:
        return
    shots = week.take_screenshots(app, clock, tmp_path / "shots")
    assert [p.stem for p in shots] == list(week.SHOTS) and all(p.stat().st_size > 10_000 for p in shots)


@pytest.mark.slow  # its own emulator and a week of deliveries (about a minute): make test runs it
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_make_screenshots_writes_the_pictures_of_the_planned_week(tmp_path):
    """The documented command, as make screenshots runs it (python -m devtools.week)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "devtools.week", "--into", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=week.Path(__file__).resolve().parent.parent,
        env={k: v for k, v in __import__("os").environ.items() if not k.startswith("DATASTORE_")},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.png" for name in week.SHOTS)
    said = next(line for line in done.stdout.splitlines() if line.startswith("last night"))
    counts = week.expected_counts(6)  # the plan's faults took effect, in the command's own process too
    once, more = week.ran_once_or_more(s for s in week.plan() if s.index // 288 == 6)
    from handlers.job_rows import SHOWN_ORDER  # the legend's order, as every count is listed

    others = " · ".join(
        f"{status} {counts[status]}" for status in SHOWN_ORDER if counts[status] and status != "completed"
    )
    expected = f": 288 expected · {once} ran once · {more} completed after more than one attempt · {others}"
    assert said.endswith(expected), said
