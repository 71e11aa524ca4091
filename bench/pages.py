"""What each operator's page costs over a generated week (devtools/week.py): server time, size
and Datastore RPCs per view, after one day and after the whole week, so a reader sees the
pages stay flat as records grow.

    python -m bench.pages               # print the table
    python -m bench.pages --record      # and write bench/pages.md, the figures the docs quote

On loopback, against the emulator; each view is fetched ``--repeats`` times after a warm-up,
and the median is shown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# (label, path) per view; {run} is a failed run of the last day, {day} the last day.
VIEWS = (
    ("home", "/admin/"),
    ("a job's card", "/admin/?job=invoice"),
    ("a day's history", "/admin/jobs/invoice/history?day={day}"),
    ("a day's missed slots", "/admin/jobs/invoice/history?day={day}&status=missed"),
    ("a per-minute job's day", "/admin/jobs/sync/history?day={day}"),
    ("last night", "/admin/?window=night"),
    ("a failed run", "/admin/runs/{run}"),
    ("search by client token", "/admin/search?q=by-hand"),
)
RECORDED = Path(__file__).resolve().parent / "pages.md"


def measure_pages(client: Any, counter: Any, days: int, repeats: int) -> list[dict[str, Any]]:
    """Each view's median milliseconds, bytes and Datastore RPCs over ``days`` of the week."""
    import datetime

    import webtest  # type: ignore[import-untyped]  # a dev tool: webtest is a dev requirement

    from devtools import week

    with tempfile.TemporaryDirectory() as folder:
        app, clock = week.build_week(Path(folder), client, days=days)
    site = webtest.TestApp(app)
    site.post_json("/api/v1/jobs/invoice/runs", {"clientToken": "by-hand"}, status="*")
    last_day = (clock.now() - datetime.timedelta(days=1)).date().isoformat()
    failed = site.get("/admin/jobs/invoice/history", params={"day": last_day, "status": "failed"}).html
    link = failed.select_one("tr.slot-row a[href*='/admin/runs/']")
    run_id = link["href"].rsplit("/", 1)[1] if link else "0" * 64
    rows = []
    for label, pattern in VIEWS:
        path = pattern.format(day=last_day, run=run_id)
        site.get(path, status="*")  # warm: templates compiled, caches filled
        timings, rpcs, size = [], [], 0
        for _ in range(repeats):
            counter.reset()
            started = time.perf_counter()
            answer = site.get(path, status="*")
            timings.append((time.perf_counter() - started) * 1000)
            counter.wait_until_idle()
            rpcs.append(counter.total)
            size = len(answer.body)
        rows.append(
            {
                "view": label,
                "days": days,
                "status": answer.status_int,
                "ms": statistics.median(timings),
                "bytes": size,
                "rpcs": statistics.median(rpcs),
                "reads": counter.billed()["reads"],
            }
        )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "## The operator's pages over a generated week (`python -m bench.pages`)",
        "",
        "On loopback against the emulator; the median of each view's fetches. A week is 2,016 slots"
        " of a 5-minute job with every fault, and a per-minute job's night with an outage before the last"
        " day (devtools/week.py).",
        "",
        "| view | after | status | ms | KiB | Datastore RPCs | entity reads |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        after = "1 day" if row["days"] == 1 else f"{row['days']} days"
        lines.append(
            f"| {row['view']} | {after} | {row['status']} | {row['ms']:.1f} | {row['bytes'] / 1024:.1f} |"
            f" {row['rpcs']:g} | {row['reads']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, nargs="+", default=[1, 7], help="days of the week to measure after")
    parser.add_argument("--repeats", type=int, default=5, help="fetches of each view (the median is shown)")
    parser.add_argument("--record", action="store_true", help="write bench/pages.md")
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(not 1 <= days <= 7 for days in args.days):
        parser.error("--repeats takes 1 or more, --days 1 to 7")

    import logging

    from devtools.emulator import DatastoreEmulator
    from devtools.google_fakes import GoogleFakes
    from devtools.rpc_counter import counting_client

    logging.getLogger("dedup.requests").setLevel(logging.ERROR)
    os.environ.setdefault("DEDUP_AUTH", "none")
    fakes = GoogleFakes()  # the week's pause, in Cloud Scheduler's stand-in
    os.environ.update({"GCE_METADATA_HOST": fakes.host, "GCE_METADATA_IP": fakes.host})
    os.environ["DEDUP_SCHEDULER_API_BASE"] = fakes.url
    rows = []
    with DatastoreEmulator(project="dedup-pages") as emulator:
        os.environ.update(emulator.env)
        for days in args.days:
            emulator.reset()
            client, counter = counting_client(emulator.project)
            rows += measure_pages(client, counter, days, args.repeats)
    fakes.close()
    report = render(sorted(rows, key=lambda row: ([label for label, _ in VIEWS].index(row["view"]), row["days"])))
    print(report)
    if args.record:
        RECORDED.write_text(report, encoding="utf-8")
        print(f"written to {os.path.relpath(RECORDED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
