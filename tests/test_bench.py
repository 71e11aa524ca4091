"""`make bench` as documented (`make bench RTT_MS=10`), on a small scale: every row is measured,
with and without the delaying proxy, and the report says how many sequential round trips
each outcome costs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.live
@pytest.mark.slow
def test_make_bench_with_a_round_trip_delay_reports_round_trips_per_outcome():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "DATASTORE_"))}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--requests", "10", "--no-write", "--concurrency", "4",
         "--throughput-requests", "16", "--rtt-ms", "10", "--fleet", "5", "20", "--audit-fleet", "3", "7",
         "--page-fleet", "2", "4", "--cleanup-records", "600", "--memory-runs", "20", "60",
         "--warmup-rounds", "1", "--step-runs", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = completed.stdout
    assert "## At 10 ms Datastore round trip" in report
    # A new instance's first delivery, both ways (bench/warmup.py): each case's medians in milliseconds.
    assert re.search(r"^\| no warmup .* \| - \| \d+ ms \| \d+ ms \|$", report, re.M)
    assert re.search(r"^\| inbound_services: warmup \| \d+ ms \| \d+ ms \| \d+ ms \|$", report, re.M)
    # The round trips a step adds (bench/steps.py): one per record where the fence is verified.
    assert re.search(r"^\| fenced \| 3 at_least_once steps \| \d+ \| 1 \|$", report, re.M)
    assert re.search(r"^\| fenced \| 3 at_most_once steps \| \d+ \| 2 \|$", report, re.M)
    assert "Task was destroyed" not in completed.stderr and "Traceback" not in completed.stderr
    delayed = report.split("## At 10 ms Datastore round trip")[1].split("## Over HTTP")[0]
    rows = re.findall(r"^\| ([^|]+?) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \| (-?[\d.]+) \|$", delayed, re.M)
    counted = {label: float(trips) for label, trips, _ in rows}
    # Counted on the wire through the delaying proxy: the targets of issue 26, beside the original pattern.
    assert counted["fresh run"] == 2 and counted["original pattern: fresh run"] == 6
    assert counted["completed duplicate, this instance"] == 0
    assert counted["completed duplicate, another instance"] == 1
    assert counted["original pattern: completed duplicate"] == 3
    assert counted["in-progress duplicate"] == 1 and counted["heartbeat renewal (each)"] == 1
    assert counted["manual run"] == 2 and counted["manual run, retried"] == 0
    assert counted["guarded endpoint"] == 2 and counted["guarded endpoint, retried"] == 0
    # A view of one's own behind the library's decorator (issue 38 §5): the app's protocol, the app's trips.
    assert counted["library view: fresh run"] == 2 and counted["library view: completed duplicate"] == 0
    assert counted["bad input (400)"] == 0 and counted["same job without dedup"] == 0
    assert counted["fresh run over a released record"] == 3 and counted["overlap: forbid, fresh run"] == 3
    # Where the fence is not verified: the finish is a transaction (begun by its read, or on its own).
    assert counted["fresh run, transactional path"] == 3 and counted["... begun by BeginTransaction"] == 4
    # What each is billed (the cost model's inputs): reads and writes per fresh run, none per remembered replay.
    billed_row = r"^\| (fresh run|completed duplicate, another instance) \| [^|]+ \| [^|]+ \| [\d.]+ "
    billed = dict(re.findall(billed_row + r"\| ([\d.]+ \| [\d.]+) \|", report, re.M))
    assert billed == {"fresh run": "1 | 2", "completed duplicate, another instance": "1 | 0"}
    # The cleanup rows (issue 26 §4): a backlog deleted, records per second, on loopback and delayed.
    cleanup = report.split("## Cleanup without a TTL policy")[1].split("## ")[0]
    assert "A backlog of 600 expired records" in cleanup
    assert re.search(r"^\| loopback \| [\d,]+ \| [\d,]+ \|$", cleanup, re.M)
    assert re.search(r"^\| 10 ms \| [\d,]+ \| [\d,]+ \|$", cleanup, re.M)
    # Throughput (issue 26 §1, 37 §4): keep-alive rounds alternating the app, the original pattern and
    # the job without the ledger, and where each run's CPU went, per process.
    live = report.split("## Over HTTP")[1].split("## Cleanup")[0]
    split = dict(re.findall(r"^\| ([^|]+?) \| (\d+ \| [\d.]+ \| [\d.]+ \| [\d.]+) \|$", live, re.M))
    rows = {label.split(" (")[0]: [float(x) for x in row.split(" | ")] for label, row in split.items()}
    assert set(rows) == {"with dedup", "original pattern", "without dedup"}
    with_dedup, without = rows["with dedup"], rows["without dedup"]
    assert with_dedup[1] > 0 and with_dedup[2] > without[2]  # the ledger's calls are the emulator's work
    assert "16 keep-alive client threads" in live
    assert re.search(r"CPU per run with dedup: [\d.]+x the original pattern's", live)
    assert re.search(r"Load average during the rounds: [\d.]+ to [\d.]+ on \d+ cores", live)
    # CPU per request is a column of the loopback table.
    assert re.search(r"^\| fresh run \|.*\| [\d.]+ \|$", report, re.M)
    # The fleet rows (issue 24 §7): start-up and one audit pass per size, on loopback and delayed.
    fleet = report.split("## At fleet size")[1].split("## ")[0]
    sizes = re.findall(r"^\| ([\d,]+) \| ([\d.]+) \| (-?[\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", fleet, re.M)
    assert [size for size, *_ in sizes] == ["5", "20"]  # start-up CPU, memory, the pass on loopback and delayed
    # The audit's steady-state pass (issue 37 §3): per Scheduler job, its marks moved in one commit.
    audit = report.split("## The audit at fleet size")[1]
    measured = re.findall(r"^\| (\d+) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|$", audit, re.M)
    assert [size for size, _, _ in measured] == ["3", "7"]
    # 15 slots' records (none ran, so none noted itself in a day summary), the job's pauses, its mark read
    # twice (batched, then in the commit's transaction), and its two day summaries (schedules.summaries);
    # and its share's attention entity, read before it is written (schedules.attention): one a share.
    assert all(float(reads) == round(20 + 1 / int(size), 1) for size, _, reads in measured)
    # The pages at fleet size (issue 37 §1): each page's calls and reads, per fleet.
    shown = report.split("## The operator's pages at fleet size")[1]
    row = r"^\| (\d+) \| ([^|]+?) \| ([^|]+?) \| (\d+) \| [\d.]+ \| [\d.]+ \| (\d+) \| ([\d,]+) \|$"
    pages = re.findall(row, shown, re.M)
    assert [(jobs, day, page, status) for jobs, day, page, status, _, _ in pages] == [
        (jobs, day, page, "200")
        for jobs in ("2", "4")
        for day in ("none delivered", "all completed")
        for page in ("home", "a day's history")
    ]
    # A completed day's pages read the jobs' summaries, never a record per slot: fewer reads.
    reads = {(jobs, day, page): int(n.replace(",", "")) for jobs, day, page, _, _, n in pages}
    assert all(
        reads[("4", "all completed", p)] < reads[("4", "none delivered", p)] for p in ("home", "a day's history")
    )
    # A worker's memory over fresh runs (issue 37 §2), the app beside the original pattern.
    worker = report.split("## Worker memory over fresh runs")[1]
    measured = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", worker, re.M)
    assert [runs for runs, _, _ in measured] == ["20", "60"] and all(float(m) > 20 for _, *mib in measured for m in mib)
    assert re.search(r"^\| growth after the first 20 \| [+-][\d.]+ \| [+-][\d.]+ \|$", worker, re.M)


@pytest.mark.parametrize(
    "args",
    [("--requests", "0"), ("--requests", "-1"), ("--concurrency", "0"), ("--throughput-requests", "0"),
     ("--rtt-ms", "-5"), ("--rtt-ms", "nan"), ("--rtt-ms", "inf"), ("--requests", "many"), ("--fleet", "0"),
     ("--audit-fleet", "0"), ("--page-fleet", "0"), ("--memory-runs", "0"), ("--memory-runs", "20", "10"),
     ("--memory-runs", "5", "5"), ("--cleanup-records", "0"), ("--warmup-rounds", "0")],
)  # fmt: skip
def test_bad_arguments_are_refused_before_anything_runs(args, capsys):
    from bench import run

    # main() parses first: a refused argument exits 2 before any server, emulator or request starts.
    with pytest.raises(SystemExit) as exited:
        run.main(["--no-write", *args])
    printed = capsys.readouterr()
    assert exited.value.code == 2 and "error" in printed.err and not printed.out


def test_a_run_writes_an_ignored_file_and_records_only_on_request():
    from bench import run

    assert run.parse_args([]).output == run.LAST_RUN_FILE
    ignored = subprocess.run(["git", "check-ignore", "--quiet", run.LAST_RUN_FILE], cwd=ROOT)
    assert ignored.returncode == 0, "bench/last-run.md must be ignored by git"
    assert run.parse_args(["--record"]).output == run.RESULTS_FILE == os.path.join(ROOT, "bench", "results.md")
    assert run.parse_args(["--no-write"]).output is None


def medians_at_rtt(results: str) -> dict[str, float]:
    delayed = results.split("Datastore round trip (`make bench")[1].split("## Over HTTP")[0]
    return {label: float(median) for label, median in re.findall(r"^\| ([^|]+?) \| ([\d.]+) \|", delayed, re.M)}


def test_the_docs_quote_the_last_results():
    """docs/retention-and-cost.md's figures at 10 ms are bench/results.md's, whoever ran `make bench` last."""
    with open(os.path.join(ROOT, "bench", "results.md"), encoding="utf-8") as handle:
        medians = medians_at_rtt(handle.read())
    with open(os.path.join(ROOT, "docs", "retention-and-cost.md"), encoding="utf-8") as handle:
        docs = " ".join(handle.read().split())

    def ms(label: str) -> str:
        return f"{medians[label]:.1f} ms"

    sentence = (
        f"a fresh run {ms('fresh run')} against the original pattern's {ms('original pattern: fresh run')}, "
        f"a completed duplicate elsewhere {ms('completed duplicate, another instance')} against "
        f"{ms('original pattern: completed duplicate')}, an in-progress duplicate {ms('in-progress duplicate')} "
        f"against {ms('original pattern: in-progress duplicate')}, {ms('completed duplicate, this instance')} "
        "from memory"
    )
    assert sentence in docs, "bench/results.md changed: quote its medians in docs/retention-and-cost.md"
