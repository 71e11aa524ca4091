"""bench/pages.py as documented: each operator's page measured over more and fewer of the
generated week's records.  The Datastore RPCs a view sends (not its time: timings are the
benchmark's, never a test's) are the same after one day as after two: the pages stay flat as
records grow."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from bench import pages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.live
@pytest.mark.slow  # its own emulator and two days of the week: make test runs it
def test_each_page_sends_as_many_rpcs_after_two_days_as_after_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DATASTORE_"))}
    done = subprocess.run(
        [sys.executable, "-m", "bench.pages", "--days", "1", "2", "--repeats", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(
        r"^\| ([^|]+?) \| (\d) days? \| (\d+) \| [\d.]+ \| [\d.]+ \| (\d+) \| (\d+) \|$", done.stdout, re.M
    )
    rpcs = {(view, int(days)): int(count) for view, days, _, count, _ in rows}
    reads = {(view, int(days)): int(count) for view, days, _, _, count in rows}
    assert {view for view, _ in rpcs} == {label for label, _ in pages.VIEWS}
    assert all(status in ("200", "303") for _, _, status, _, _ in rows)
    for label, _ in pages.VIEWS:
        assert rpcs[(label, 1)] == rpcs[(label, 2)], label
    # Issue 39 §9: a per-minute job's day (1,440 slots, by the hour) costs the order of a 5-minute
    # job's (288, slot by slot): its round trips and entity reads within 1.5 times.
    for days in (1, 2):
        minute, five = ("a per-minute job's day", days), ("a day's history", days)
        assert rpcs[minute] <= 1.5 * rpcs[five] and reads[minute] <= 1.5 * reads[five], (rpcs, reads)


@pytest.mark.parametrize("args", [("--repeats", "0"), ("--days", "0"), ("--days", "8"), ("--days", "x")])
def test_bad_arguments_are_refused_before_anything_starts(args):
    with pytest.raises(SystemExit) as stopped:
        pages.main(list(args))
    assert stopped.value.code == 2


def test_the_recorded_figures_are_a_table_of_every_view():
    with open(pages.RECORDED, encoding="utf-8") as handle:
        recorded = handle.read()
    assert all(f"| {label} | 1 day |" in recorded and f"| {label} | 7 days |" in recorded for label, _ in pages.VIEWS)
