"""`make bench` as documented (`make bench RTT_MS=10`), on a small scale: every row is measured,
with and without the delaying proxy, and the report says how many sequential round trips
each outcome costs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.live, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_make_bench_with_a_round_trip_delay_reports_round_trips_per_outcome():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DATASTORE_"))}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--requests", "10", "--no-write", "--concurrency", "4",
         "--throughput-requests", "16", "--rtt-ms", "10"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = completed.stdout
    assert "## At 10 ms Datastore round trip" in report and "Task was destroyed" not in completed.stderr
    trips = dict(re.findall(r"^\| ([^|]+?) \| [\d.]+ \| [\d.]+ \| (-?[\d.]+) \|$", report, re.M))
    # The counts on the wire, seen as latency: a completed duplicate this process finished is answered
    # from its cache (no round trip), bad input never reaches Datastore.
    assert round(float(trips["completed duplicate"])) == 0
    assert round(float(trips["bad input (400)"])) == 0
    assert float(trips["fresh run"]) > float(trips["completed duplicate"])
