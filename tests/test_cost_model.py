"""The cost model (bench/cost.py, docs/retention-and-cost.md "What it costs a month"): each of its per-outcome
entity operations is the one counted on the wire, its instance hours follow from the cadence of the
requests, its defaults are app.yaml's and cron.yaml's, and the docs quote its output."""

from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import sys

import pytest
import webtest
import yaml

from bench import cost
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.queries import CLEANUP_BATCH
from devtools.rpc_counter import counting_client
from handlers import create_app
from tests.support.deliveries import JOBS, scheduler_headers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXCLUSIVE = JOBS.replace("    lease_seconds: 60\n", "    lease_seconds: 60\n    overlap: forbid\n", 1)


def billed(counter) -> cost.Operations:
    """What the wire carried since the last call (a TTL's deletes never travel it)."""
    counter.wait_until_idle()
    counts = counter.billed()
    counter.reset()
    return cost.Operations(counts["reads"], counts["writes"], counts["deletes"])


def on_the_wire(operations: cost.Operations) -> cost.Operations:
    return cost.Operations(operations.reads, operations.writes, operations.deletes)


@pytest.fixture
def counted(datastore):
    return counting_client(datastore.project)


def test_the_model_counts_what_the_wire_counts(counted, jobs_file, clock):
    client, counter = counted
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == on_the_wire(cost.FRESH_RUN) and cost.FRESH_RUN.expiry_deletes == 1
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == cost.DUPLICATE_REMEMBERED
    other = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
    other.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == cost.DUPLICATE_ELSEWHERE
    with client.context():
        ledger = Ledger(clock)
        owner = ledger.replay_or_claim("held", RunDescription("scheduler", "invoice"), RunPolicy(600, 7200)).attempt
        counter.reset()
        ledger.renew_lease(owner, 600)
        assert billed(counter) == cost.RENEWAL


def test_without_a_ttl_policy_the_cleanup_reads_each_record_again_and_deletes_it(counted, jobs_file, clock):
    client, counter = counted
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    clock.advance(8 * 86400)  # past the retention
    with client.context():
        counter.reset()
        assert Ledger(clock).delete_expired()[0] == 1
    counter.wait_until_idle()
    assert counter.snapshot().get("RunQuery") == 1  # the keys-only query: one read per batch
    assert billed(counter) == cost.Operations(reads=1, deletes=1)
    assert cost.CLEANUP_PER_RECORD == cost.Operations(reads=1 + 1 / CLEANUP_BATCH, deletes=1)


def test_the_job_lock_adds_what_the_model_says(counted, jobs_file, clock):
    client, counter = counted
    app = webtest.TestApp(create_app(jobs_file=jobs_file(EXCLUSIVE), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == on_the_wire(cost.FRESH_RUN + cost.JOB_LOCK)
    with client.context():
        ledger = Ledger(clock)
        policy = RunPolicy(600, 7200, exclusive=True)
        owner = ledger.claim_run("held", RunDescription("scheduler", "invoice"), policy).attempt
        counter.reset()
        ledger.renew_lease(owner, 600)
        assert billed(counter) == cost.RENEWAL + cost.JOB_LOCK_RENEWAL


def test_an_audit_pass_costs_what_the_model_says(counted, clock):
    from schedules.audit import audit
    from schedules.bound import BoundJob
    from schedules.config import SchedulerJob

    client, counter = counted
    hourly = BoundJob(
        SchedulerJob(name="hourly", target="invoice", schedule="0 * * * *", project="acme-prod", location="us-central1")
    )
    with client.context():
        ledger = Ledger(clock)
        audit(ledger, (hourly,))  # the first pass sets the mark
        clock.advance(6 * 3600)
        counter.reset()
        missed = audit(ledger, (hourly,)).reported
    slots = len(missed)  # every slot whose window closed since: none ran, each read once
    assert slots >= 4
    assert billed(counter) == cost.AUDIT_PER_JOB_PASS + cost.AUDIT_PER_SLOT * slots


PRICES = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}


def test_the_formula_prices_each_kind_less_its_free_usage_and_ttl_deletes_get_none():
    daily = cost.Operations(reads=150_000, writes=20_000, deletes=30_000, expiry_deletes=1_000)
    expected = 30.4 * ((150_000 - 50_000) * 0.03 + 0 * 0.09 + (30_000 - 20_000) * 0.01 + 1_000 * 0.01) / 100_000
    assert cost.monthly_cost(daily, PRICES) == pytest.approx(expected)
    without = 30.4 * (150_000 * 0.03 + 20_000 * 0.09 + 31_000 * 0.01) / 100_000
    assert cost.monthly_cost(daily, PRICES, free=False) == pytest.approx(without)
    assert cost.monthly_cost(cost.Operations(reads=49_999, writes=19_999, deletes=19_999), PRICES) == 0


def test_the_fleets_add_up():
    hourly, minutely, guarded = cost.FLEETS
    # 1,000 minutely jobs: a run, a renewal, 1 % duplicates, its slot noted (the audit reads the note,
    # not the record); 96 audit passes a job.
    per_run = cost.FRESH_RUN + cost.RENEWAL + cost.DUPLICATE_ELSEWHERE * 0.01 + cost.SLOT_NOTE
    expected = per_run * 1_440_000 + cost.AUDIT_PER_JOB_PASS * (1000 * 96)
    assert minutely.operations_per_day() == expected
    assert guarded.operations_per_day().reads == pytest.approx(guarded.runs_per_day * (1 + 0.05 * 0.9))
    assert cost.monthly_cost(hourly.operations_per_day(), PRICES) < 0.01  # inside the free usage but TTL deletes
    with_cleanup = minutely.operations_per_day(cleanup=True)
    assert with_cleanup.expiry_deletes == 0 and with_cleanup.deletes == 1_440_000


def test_instance_hours_follow_the_cadence_of_the_requests():
    hourly, minutely, guarded = cost.FLEETS
    audited_hourly = cost.Hosting(audit_minutes=60)
    # Hourly requests and nothing more often: each keeps an instance up 15 minutes, a quarter of the day.
    assert audited_hourly.instance_hours_per_day(hourly) == 6
    # Anything every 15 minutes or more often (the audit cron as shipped, a */5 job) keeps one up all day.
    assert cost.Hosting().instance_hours_per_day(hourly) == 24
    every_five = cost.Fleet("*/5", runs_per_day=288, interval_minutes=5)
    assert audited_hourly.instance_hours_per_day(every_five) == 24
    # min_instances are up all day, whatever the cadence.
    assert cost.Hosting(audit_minutes=60, min_instances=2).instance_hours_per_day(hourly) == 48
    # 1,000 requests at once, 10 an instance: 100 instances, kept up by a request every minute.
    assert cost.Hosting().instance_hours_per_day(minutely) == 2400
    assert cost.Hosting(concurrent_requests=1000).instance_hours_per_day(minutely) == 24
    assert cost.Hosting().instance_hours_per_day(guarded) == 24  # 8 at once fit one instance


def test_instance_hours_are_priced_by_class_less_the_free_f1_hours():
    assert cost.INSTANCE_PRICES == {"F1": 0.05, "F2": 0.10, "F4": 0.20, "F4_1G": 0.30}
    free = 28 * 0.05  # $1.40 a day, whatever the class
    assert cost.Hosting(instance_class="F2").monthly_cost(24) == pytest.approx(30.4 * (24 * 0.10 - free))
    assert cost.Hosting(instance_class="F1").monthly_cost(24) == 0  # inside the free hours
    assert cost.Hosting(instance_class="F4_1G").monthly_cost(6) == pytest.approx(30.4 * (6 * 0.30 - free))
    assert cost.Hosting(instance_price=1.0, free_instance_hours=0).monthly_cost(10) == pytest.approx(304)


def test_the_defaults_are_what_app_yaml_and_cron_yaml_deploy():
    with open(os.path.join(ROOT, "app.yaml"), encoding="utf-8") as handle:
        app = yaml.safe_load(handle)
    scaling = app.get("automatic_scaling") or {}
    assert "basic_scaling" not in app and "manual_scaling" not in app  # the model is automatic scaling's
    hosting = cost.Hosting()
    assert hosting.instance_class == app["instance_class"]
    assert hosting.min_instances == scaling.get("min_instances", 0)
    assert hosting.concurrent_requests == scaling.get("max_concurrent_requests", 10)
    with open(os.path.join(ROOT, "cron.yaml"), encoding="utf-8") as handle:
        (audit,) = [entry for entry in yaml.safe_load(handle)["cron"] if entry["url"] == "/tasks/audit"]
    assert audit["schedule"] == f"every {cost.AUDIT_MINUTES} minutes"


def hourly_row(*args: str) -> list[str]:
    completed = run_cost(*args)
    assert completed.returncode == 0, completed.stderr
    (row,) = [line for line in completed.stdout.splitlines() if line.startswith("| 10 jobs hourly |")]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_command_takes_the_hosting_as_parameters():
    assert hourly_row()[-3:] == ["24.0", "30.40", "30.40"]
    assert hourly_row("--audit-minutes", "60")[-3:] == ["6.0", "0.00", "0.00"]  # 6 F2 hours: inside the free 28
    assert hourly_row("--audit-minutes", "60", "--instance-class", "F4_1G")[-3:] == ["6.0", "12.16", "12.16"]
    assert hourly_row("--instance-class", "F1")[-3:] == ["24.0", "0.00", "0.00"]  # docs/retention-and-cost.md says so
    assert hourly_row("--audit-minutes", "60", "--min-instances", "1")[-3:] == ["24.0", "30.40", "30.40"]
    assert hourly_row("--instance-price", "1", "--free-instance-hours", "0")[-2] == "729.60"


def run_cost(*args: str) -> subprocess.CompletedProcess:
    """``python -m bench.cost ARGS`` as its ``main`` runs it, in this process (a Python of its own
    costs the fast tier most of a second of CPU a call); ``test_the_docs_quote_the_command`` runs
    the module as a user does, once."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            returncode = cost.main(list(args))
        except SystemExit as refused:  # argparse's: usage and the error on stderr, exit status 2
            returncode = refused.code if isinstance(refused.code, int) else 1
    return subprocess.CompletedProcess(["bench.cost", *args], returncode, stdout.getvalue(), stderr.getvalue())


def test_the_docs_quote_the_command():
    completed = subprocess.run(
        [sys.executable, "-m", "bench.cost"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    with open(os.path.join(ROOT, "docs", "retention-and-cost.md"), encoding="utf-8") as handle:
        docs = handle.read()
    assert completed.stdout.strip() in docs
    assert run_cost("--cleanup", "--no-free-tier").returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ("--read-price", "-1"),
        ("--write-price", "cheap"),
        ("--delete-price", "nan"),
        ("--read-price", "inf"),
        ("--nope",),
        ("--instance-class", "F3"),
        ("--min-instances", "-1"),
        ("--audit-minutes", "0"),
        ("--idle-minutes", "nan"),
        ("--concurrent-requests", "0"),
        ("--instance-price", "-0.1"),
    ],
)
def test_bad_prices_are_refused(args):
    completed = run_cost(*args)
    assert completed.returncode == 2 and "error" in completed.stderr and not completed.stdout


def test_no_nan_reaches_a_total():
    assert not math.isnan(cost.monthly_cost(cost.FLEETS[0].operations_per_day(), PRICES))


def test_a_slots_run_writes_the_points_the_metrics_model_prices(site_with_a_schedule, clock, measured):
    """Issue 41: a decided slot's run moves 2 scalar series (its outcome, its claim's round trips) and
    3 distributions; written only when changed, that is what it costs in Cloud Monitoring."""
    clock.advance(10)
    site_with_a_schedule.post(
        "/jobs/invoice?project=acme-prod&location=us-central1",
        b"",
        headers=scheduler_headers(scheduler_job_name="invoice-hourly", schedule_time="2030-01-01T00:00:00Z"),
        status=200,
    )
    measured.read()
    assert {"scalar": len(measured.sums), "distribution": len(measured.samples)} == cost.SLOT_POINTS


@pytest.fixture
def site_with_a_schedule(google, ndb_client, tmp_path, clock, monkeypatch):
    from tests.support.schedule_sites import schedule_site

    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    schedules = """
        jobs:
          invoice-hourly:
            target: invoice
            schedule: "0 * * * *"
            project: acme-prod
            location: us-central1
            start_at: 2030-01-01T00:00:00Z
            attempt_deadline: 60s
    """
    return schedule_site(tmp_path, JOBS, schedules, clock, ndb_client)


def test_the_metrics_model_prices_bytes_by_tier_less_the_free_mib():
    assert cost.metrics_mib_per_month(1) == pytest.approx((2 * 8 + 3 * 80) * 30.4 / 2**20)
    assert cost.metrics_mib_per_month(0, jobs=1) == pytest.approx(96 * 8 * 30.4 / 2**20)  # the audit's ages
    assert cost.metrics_monthly_cost(150) == 0 and cost.metrics_monthly_cost(149) == 0
    assert cost.metrics_monthly_cost(1150) == pytest.approx(1000 * 0.258)
    beyond = 100_000 * 0.258 + 150_000 * 0.151 + 50_000 * 0.061
    assert cost.metrics_monthly_cost(300_000, free=0) == pytest.approx(beyond)
    rows = {line.split("|")[1].strip(): line for line in cost.metrics_report().splitlines() if line.startswith("| ")}
    assert "| 1,440,000 | 6,000 | 26,000 | 10,710 | 2,724.42 |" in rows["1,000 jobs every minute"]
