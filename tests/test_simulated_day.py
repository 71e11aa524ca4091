"""Chaos: a simulated day of Cloud Scheduler deliveries against gunicorn (devtools/simulate.py).

200 executions with 30% duplicate deliveries, 10% lost acknowledgements, 5%
worker kills, 10% transient failures, 10% side effects slower than the
attempt deadline and 5% executions never delivered (outages): every delivered
execution's side effect happens, and happens once (counted at the downstream
by key), no record is left in progress after its lease, and the executions
listing says of each slot what happened: completed, or missed for the outages.
Two Force runs (the next slot's time, and their own) each take effect once under
a key of their own, and neither takes the slot its time names.
"""

from __future__ import annotations

import datetime
import os
import random
import textwrap

import pytest

from devtools import schedule_day
from devtools.effect_sink import EffectSink, Faults
from devtools.gunicorn import GunicornServer
from devtools.simulate import (
    list_executions,
    misplaced_force_runs,
    report,
    simulate,
    simulation_jobs_file,
    unexplained,
)
from models import RunRecord, RunStatus
from schedules.config import parse_scheduler_document

pytestmark = pytest.mark.live

# Retries must outlast a lease held by a killed worker (3 deadlines here), or
# Scheduler gives up before the run can be taken over.
SCHEDULE = textwrap.dedent("""
    defaults:
      project: acme-prod
      location: us-central1
      attempt_deadline: 1m
      retry: {retry_count: 5, min_backoff: 1m, max_backoff: 5m, max_doublings: 2}
    jobs:
      sync-every-15:
        target: sync-crm
        schedule: "*/15 * * * *"
      digest-hourly:
        target: ledger-digest
        schedule: "5 * * * *"
""")


def test_a_simulated_day(datastore, ndb_client, tmp_path):
    import yaml

    jobs = parse_scheduler_document(yaml.safe_load(SCHEDULE))
    compress = 60.0
    faults = Faults(duplicates=0.3, lost_acks=0.1, slow=0.1, transient=0.1, worker_kills=0.05, outages=0.05)
    sink = EffectSink(faults, slow_seconds=1.5, rng=random.Random(11))
    jobs_file = simulation_jobs_file(jobs, sink.url, compress)
    try:
        with GunicornServer(datastore, jobs_file, quiet=True) as server:
            simulation = simulate(
                server.url, jobs, 200, compress, faults, seed=3, sink=sink, server_pid=server.process.pid
            )
    finally:
        os.unlink(jobs_file)
    plan = simulation.plan
    with ndb_client.context():
        list_executions(plan, datetime.datetime.now(datetime.UTC), simulation.force_runs)
    table, page = report(plan, simulation.force_runs)
    (tmp_path / "simulation.html").write_text(page)
    assert len(plan) == 200
    assert sum(1 for e in plan if any(a in ("deadline", "lost-ack") or a.startswith("dup:") for a in e.attempts)) > 50
    assert len(simulation.kills) > 0  # workers did die under deliveries
    # Every execution took effect at the downstream, once; any second call is explained by a kill.
    bad = unexplained(plan, simulation.kills)
    assert bad == [], "\n".join(
        f"{e.job.name} {e.schedule_time} effects={e.effects} calls={e.calls} {e.attempts}" for e in bad
    )
    # The executions listing agrees with what was delivered: each outage's slot is missed, every
    # other one completed (its effect happened once), and nothing else.
    outages = [e for e in plan if e.attempts == ["outage"]]
    assert outages and all(e.listed == "missed" for e in outages)
    disagree = [e for e in plan if e.listed != e.expected_status]
    assert disagree == [], [(e.job.name, e.schedule_time, e.listed, e.effects, e.attempts) for e in disagree]
    assert "missed" in table.splitlines()[-1]
    # Both readings of Force run: the next slot's time and its own; each ran once, under its own
    # key, through the same duplicates and lost acknowledgements, and left the slot alone.
    assert [e.force_run for e in simulation.force_runs] == ["next_slot", "execution_time"]
    assert misplaced_force_runs(simulation.force_runs) == []
    next_slot = simulation.force_runs[0]
    assert next_slot.run_id != next_slot.slot_key and next_slot.slot_taken is False
    assert "Force runs: 2 of 2 took effect once" in table.splitlines()[-1]
    with ndb_client.context():
        now = datetime.datetime.now(datetime.UTC)
        stuck = [
            r for r in RunRecord.query(RunRecord.status == RunStatus.IN_PROGRESS).fetch() if r.lease_expires <= now
        ]
    assert stuck == []


def test_a_simulated_day_of_schedule_states_on_gunicorn(datastore):
    """devtools/schedule_day.py as make simulate plays it: gunicorn's two workers on one stepped
    clock, real HTTP, the Cloud Scheduler and Cloud Tasks stand-ins, and Cloud Tasks' two
    deliveries of each caught-up slot sent at once."""
    day, scheduler_states = schedule_day.on_gunicorn(datastore)
    assert schedule_day.disagreements(day) == []
    assert scheduler_states[schedule_day.JOB_PATH] == "ENABLED"  # paused at 04:30, resumed at 08:30


def test_make_simulate_plays_both_parts_and_says_nothing_disagrees(tmp_path):
    """The documented command, small: its own emulator, the deliveries on a compressed clock, then
    the day of schedule states; exit 0 only when every check of both holds."""
    import subprocess
    import sys

    report = tmp_path / "report.html"
    completed = subprocess.run(
        [sys.executable, "-m", "devtools.simulate", "--executions", "12", "--compress", "120", "--report", str(report)],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    assert "executions listing: 0 slot(s) disagree" in out and "Force runs: 0 of 2 not once" in out
    assert "schedule day: 0 disagreement(s)" in out and "audit ERROR: late 2030-01-01T04:00:00.000000Z" in out
    assert "2030-01-01T00:00:00.000000Z   untracked" in out and "missed" not in out.split("A day of schedule")[1]
    assert report.read_text().startswith("<!doctype html>")
