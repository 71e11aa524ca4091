"""The cost model (bench/cost.py, docs/operations.md "What it costs"): its per-outcome
entity operations are the ones counted on the wire, and the docs quote its output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import webtest

from bench import cost
from dedup.ledger import Ledger, RunDescription, RunPolicy
from devtools.rpc_counter import counting_client
from handlers import create_app
from tests.support.deliveries import JOBS, scheduler_headers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def billed(counter) -> cost.Operations:
    counter.wait_until_idle()
    counts = counter.billed()
    counter.reset()
    return cost.Operations(counts["reads"], counts["writes"], counts["deletes"])


@pytest.fixture
def counted(datastore):
    return counting_client(datastore.project)


def test_the_model_counts_what_the_wire_counts(counted, jobs_file, clock):
    client, counter = counted
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    expiry = cost.Operations(0, 0, cost.FRESH_RUN.deletes)  # the TTL's delete, later and not on this wire
    assert billed(counter) + expiry == cost.FRESH_RUN
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == cost.DUPLICATE_REMEMBERED
    other = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=client))
    other.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    assert billed(counter) == cost.DUPLICATE_ELSEWHERE
    with client.context():
        ledger = Ledger(clock)
        owner = ledger.claim_run("held", RunDescription("scheduler", "invoice"), RunPolicy(600, 7200)).attempt
        counter.reset()
        ledger.renew_lease(owner, 600)
        assert billed(counter) == cost.RENEWAL


def test_the_job_lock_adds_what_the_model_says(counted, jobs_file, clock):
    client, counter = counted
    exclusive = JOBS.replace("    lease_seconds: 60\n", "    lease_seconds: 60\n    overlap: forbid\n", 1)
    app = webtest.TestApp(create_app(jobs_file=jobs_file(exclusive), clock=clock, ndb_client=client))
    app.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    expiry = cost.Operations(0, 0, cost.FRESH_RUN.deletes)
    assert billed(counter) + expiry == cost.FRESH_RUN + cost.JOB_LOCK


def test_the_fleets_are_priced_by_the_formula():
    prices = {"reads": 0.03, "writes": 0.09, "deletes": 0.01}
    hourly, minutely, guarded = (fleet.operations_per_day() for fleet in cost.FLEETS)
    assert cost.monthly_cost(hourly, prices) == 0  # inside the free usage
    expected = 30.4 * ((5_774_400 - 50_000) * 0.03 + (4_320_000 - 20_000) * 0.09 + (1_440_000 - 20_000) * 0.01)
    assert cost.monthly_cost(minutely, prices) == pytest.approx(expected / 100_000)
    assert cost.monthly_cost(guarded, {k: 2 * v for k, v in prices.items()}, free=False) == pytest.approx(
        2 * cost.monthly_cost(guarded, prices, free=False)
    )


def run_cost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.cost", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_docs_quote_the_command():
    completed = run_cost()
    assert completed.returncode == 0, completed.stderr
    with open(os.path.join(ROOT, "docs", "operations.md"), encoding="utf-8") as handle:
        docs = handle.read()
    assert completed.stdout.strip() in docs


@pytest.mark.parametrize("args", [("--read-price", "-1"), ("--write-price", "cheap"), ("--nope",)])
def test_bad_prices_are_refused(args):
    completed = run_cost(*args)
    assert completed.returncode == 2 and "error" in completed.stderr and not completed.stdout
