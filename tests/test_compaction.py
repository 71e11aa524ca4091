"""Issue 41 §3: a compacted catch-up, one run standing for the slots that never ran.

DBOS #803's case: a per-minute job suspended for 78 minutes.  Resumed with ``catch_up: compact``
(or caught up by ``misfire: compact`` after an outage nobody delivered), one run is dispatched,
under the newest slot's key, given the times of the others; each of those is recorded covered
(``compacted_into`` the run), listed ``covered``, never missed, and never runs on its own: a late
Scheduler delivery of one, or an operator's run of it, is answered from its record as a duplicate.
"""

from __future__ import annotations

import datetime
import logging

import pytest
import webtest

from dedup.keys import format_utc
from devtools.cloud_tasks_fake import to_webtest
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.metrics import Measured
from tests.support.schedule_sites import CRON, T0, schedule_site

SCHEDULES = """
defaults:
  project: acme-prod
  location: us-central1
  start_at: 2030-01-01T00:00:00Z
  retry: {retry_count: 2, min_backoff: 30s, max_backoff: 60s}
jobs:
  invoice-minutely:
    target: invoice
    schedule: "* * * * *"
    attempt_deadline: 30s
%s"""
SUSPENDED_MINUTES = 78  # DBOS #803


def minute(n: int) -> str:
    return format_utc(T0 + datetime.timedelta(minutes=n))


@pytest.fixture
def make_site(cloud_tasks, ndb_client, tmp_path, clock, monkeypatch, google):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)

    def build(extra: str = "") -> webtest.TestApp:
        return schedule_site(tmp_path, JOBS, SCHEDULES % extra, clock, ndb_client)

    return build


def deliver(site, n: int, status: int = 200):
    headers = scheduler_headers(scheduler_job_name="invoice-minutely", schedule_time=minute(n))
    return site.post("/jobs/invoice?project=acme-prod&location=us-central1", b"", headers=headers, status=status)


def statuses(site, first: int, last: int) -> dict[str, str]:
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": minute(first), "until": minute(last + 1)}).json
    return {e["schedule_time"]: e["status"] for e in page["executions"]}


def suspended(site, clock) -> None:
    """00:00 ran; paused at 00:00:30 for 78 minutes: 00:01 to 01:18 never delivered."""
    clock.advance(10)
    deliver(site, 0)
    clock.advance(20)
    site.post_json("/api/v1/scheduler-jobs/invoice-minutely/pause", {"note": "suspended"})
    clock.advance(SUSPENDED_MINUTES * 60 + 20)  # 01:18:50


def resume(site, mode: str = "compact"):
    return site.post_json("/api/v1/scheduler-jobs/invoice-minutely/resume", {"catch_up": mode}).json


def test_a_78_minute_suspension_is_caught_up_by_one_run_standing_for_every_slot(
    make_site, clock, cloud_tasks, measured: Measured
):
    site = make_site()
    suspended(site, clock)
    answer = resume(site)
    # One run, the newest slot's, is dispatched; it stands for the 77 before it.
    assert [c["schedule_time"] for c in answer["caught_up"]] == [minute(SUSPENDED_MINUTES)]
    assert len(cloud_tasks.tasks) == 1
    assert answer["compacted"] == {
        "run_id": answer["caught_up"][0]["run_id"],
        "schedule_time": minute(SUSPENDED_MINUTES),
        "covered": SUSPENDED_MINUTES - 1,
        "first": minute(1),
        "last": minute(SUSPENDED_MINUTES - 1),
        "not_covered": [],
    }
    cloud_tasks.deliver(to_webtest(site), times=2)  # the queue delivers its task twice: one run
    (ran,) = job_targets.EFFECTS[1:]
    assert format_utc(ran["schedule_time"]) == minute(SUSPENDED_MINUTES)
    covers = [datetime.datetime.fromisoformat(time) for time in ran["covers"]]
    assert [format_utc(time) for time in covers] == [minute(n) for n in range(1, SUSPENDED_MINUTES)]
    listed = statuses(site, 0, SUSPENDED_MINUTES)
    assert listed == {
        minute(0): "completed",
        **{minute(n): "covered" for n in range(1, SUSPENDED_MINUTES)},
        minute(SUSPENDED_MINUTES): "completed",
    }
    # Each covered slot names the run that stands for it.
    page = site.get("/api/v1/jobs/invoice/executions", params={"since": minute(5), "until": minute(6)}).json
    (one,) = page["executions"]
    assert one["status"] == "covered" and one["compacted_into"] == answer["compacted"]["run_id"]
    assert one["reason"].startswith(f"compacted: the run of {minute(SUSPENDED_MINUTES)}")
    # A late Scheduler delivery of a covered slot: a duplicate of the compacted run, the job not run.
    late = deliver(site, 5).json
    assert late["duplicate"] is True and late["compacted_into"] == answer["compacted"]["run_id"]
    # An operator's run of it likewise: a covered slot never runs on its own.
    by_hand = site.post(f"/api/v1/jobs/invoice/executions/{minute(5)}/run?attempt=0", status=200).json
    assert by_hand["duplicate"] is True and len(job_targets.EFFECTS) == 2
    # The resume sent again: nothing left to do, nothing dispatched.
    assert resume(site)["caught_up"] == [] and len(cloud_tasks.tasks) == 1
    # Counted: 77 covered, the compacted run once, never a missed or paused slot.
    counted = measured.counts("dedup.slot.outcomes", by="outcome", scheduler_job="invoice-minutely")
    assert counted == {"ran_once": 2, "covered": SUSPENDED_MINUTES - 1, "duplicate": 1}


def test_a_slot_delivered_meanwhile_is_not_covered_and_runs_once(make_site, clock, cloud_tasks):
    """A delivery during the pause runs (saying so): compaction covers only the slots that never ran."""
    site = make_site()
    suspended(site, clock)
    deliver(site, 40)  # Scheduler delivered one slot of the pause anyway (its pause was not applied yet)
    answer = resume(site)
    assert answer["compacted"]["covered"] == SUSPENDED_MINUTES - 2
    cloud_tasks.deliver(to_webtest(site))
    ran = sorted(format_utc(e["schedule_time"]) for e in job_targets.EFFECTS)
    assert ran == [minute(0), minute(40), minute(SUSPENDED_MINUTES)]
    assert minute(40) not in job_targets.EFFECTS[-1]["covers"]
    assert statuses(site, 40, 40) == {minute(40): "completed"}


def test_a_compaction_sent_again_before_its_run_dispatches_the_same_run_with_every_covered_slot(
    make_site, clock, cloud_tasks
):
    """The resume's answer lost before the task ran: sent again, it finds the slots it covered and
    dispatches the same run (the queue refuses it) with all of them, so none is lost."""
    site = make_site()
    suspended(site, clock)
    first = resume(site)
    again = resume(site)
    assert again["caught_up"][0]["already_dispatched"] is True
    assert again["compacted"]["covered"] == first["compacted"]["covered"] == SUSPENDED_MINUTES - 1
    assert len(cloud_tasks.tasks) == 1


def test_misfire_compact_catches_up_an_outage_with_one_run(make_site, clock, cloud_tasks, caplog):
    """No deliveries for 78 minutes (an outage, not a pause): the audit covers the missed slots
    with one run of the newest, logs the catch-up, and reports none of them missed."""
    site = make_site("    misfire: compact\n")
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(SUSPENDED_MINUTES * 60 + 180)
    answer = site.get("/tasks/audit", headers=CRON).json
    assert answer["missed"] == [] and len(cloud_tasks.tasks) == 1
    cloud_tasks.deliver(to_webtest(site), times=2)
    (ran,) = job_targets.EFFECTS
    newest = int((ran["schedule_time"] - T0).total_seconds() // 60)  # the newest slot whose window closed
    assert newest >= SUSPENDED_MINUTES - 5
    covers = [format_utc(datetime.datetime.fromisoformat(time)) for time in ran["covers"]]
    assert covers == [minute(n) for n in range(newest)]  # every slot before it, from the first
    listed = statuses(site, 0, newest)
    assert listed == {**{minute(n): "covered" for n in range(newest)}, minute(newest): "completed"}
    lines = [r for r in caplog.records if r.name == "dedup.audit" and r.levelno >= logging.ERROR]
    assert lines == []  # none reported missed
    # A second pass finds nothing more to catch up.
    site.get("/tasks/audit", headers=CRON)
    assert len(cloud_tasks.tasks) == 1


def test_a_compaction_the_queue_refused_keeps_its_slots_covered_and_its_run_to_run(make_site, clock, cloud_tasks):
    """Nothing is ever uncovered: the slots stay covered into the newest slot's run, which stays to
    run (paused), and the resume sent again dispatches it, standing for every one of them."""
    site = make_site()
    suspended(site, clock)
    cloud_tasks.fail_next = [503]
    failed = site.post_json("/api/v1/scheduler-jobs/invoice-minutely/resume", {"catch_up": "compact"}, status=502).json
    assert failed["error"] == "DispatchFailed"
    listed = statuses(site, 1, SUSPENDED_MINUTES)
    assert listed.pop(minute(SUSPENDED_MINUTES)) == "paused" and set(listed.values()) == {"covered"}
    answer = resume(site)
    assert answer["compacted"]["covered"] == SUSPENDED_MINUTES - 1 and len(cloud_tasks.tasks) == 1
    cloud_tasks.deliver(to_webtest(site))
    assert len(job_targets.EFFECTS[-1]["covers"]) == SUSPENDED_MINUTES - 1


def test_the_newest_slot_run_by_hand_first_stands_for_every_covered_slot(make_site, clock, cloud_tasks):
    """Its run reads what it stands for from the ledger, whoever runs it: an operator's run of the
    newest slot, before the task, takes them all, and the task is then a duplicate."""
    site = make_site()
    suspended(site, clock)
    resume(site)
    by_hand = site.post(f"/api/v1/jobs/invoice/executions/{minute(SUSPENDED_MINUTES)}/run?attempt=0", status=200)
    assert by_hand.json["status"] == "completed" and len(job_targets.EFFECTS[-1]["covers"]) == SUSPENDED_MINUTES - 1
    cloud_tasks.deliver(to_webtest(site))
    assert len(job_targets.EFFECTS) == 2  # 00:00's delivery, and the compacted run once


def test_a_covered_slot_is_final_inside_the_claim_and_nothing_is_covered_once_its_run_began(ndb_context, clock):
    """The ledger's own rules, below any view: a claim that reopens a covered slot at its attempt
    is answered from its record, and a skip into a run that has begun writes nothing."""
    from dedup.claims import ClaimRequest, RunDescription, RunPolicy
    from dedup.ledger import Ledger
    from dedup.outcomes import Claimed, Replayed

    ledger, policy = Ledger(clock), RunPolicy(60, 86_400)
    description = RunDescription("scheduler", "invoice", "invoice-minutely")
    assert ledger.stand_for("n" * 64, description, policy, ["2030-01-01T00:01:00.000000Z"])

    def skip(run_id: str) -> ClaimRequest:
        return ClaimRequest(run_id, description, policy, reopen_attempt=0, skip_reason="compacted", covered_by="n" * 64)

    assert [s.record.run_id for s in ledger.skip_runs([skip("a" * 64)])] == ["a" * 64]
    again = ledger.claim_run("a" * 64, description, policy, reopen_attempt=0)  # a backfill at the attempt it saw
    assert isinstance(again, Replayed) and again.record.compacted_into == "n" * 64
    # The dashboard's queued run asks the same rule first: a covered slot queues nothing.
    from service.runs import starts_a_run

    assert not starts_a_run(ledger.lookup("a" * 64), clock.now(), reopen_attempt=0)
    claimed = ledger.claim_run("n" * 64, description, policy)  # the standing run begins
    assert isinstance(claimed, Claimed) and claimed.attempt.covers == ("2030-01-01T00:01:00.000000Z",)
    assert ledger.skip_runs([skip("b" * 64)]) == [] and ledger.lookup("b" * 64) is None
    assert not ledger.stand_for("n" * 64, description, policy, ["2030-01-01T00:02:00.000000Z"])


def test_an_external_jobs_compaction_is_refused_saying_why(ndb_client, tmp_path, clock, monkeypatch, google):
    """An external job's own handler runs its slots and cannot be given the covered ones."""
    from tests.test_external_targets import jobs_yaml

    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    external = jobs_yaml("https://reports-abc123-uc.a.run.app/jobs/reports").replace("reports:", "invoice:")
    site = schedule_site(tmp_path, external, SCHEDULES % "", clock, ndb_client)
    site.post_json("/api/v1/scheduler-jobs/invoice-minutely/pause", {})
    clock.advance(600)
    refused = site.post_json("/api/v1/scheduler-jobs/invoice-minutely/resume", {"catch_up": "compact"}, status=400).json
    assert "catch up with latest or all" in refused["detail"]


def test_the_manuals_answer_is_the_one_the_app_gives(make_site, clock, cloud_tasks):
    """docs/schedules.md's example answer: its ``compacted`` keys are exactly the app's, and what
    it leaves out (``...``) is all it leaves out of a caught-up slot."""
    import json
    import pathlib

    text = (pathlib.Path(__file__).parent.parent / "docs" / "schedules.md").read_text(encoding="utf-8")
    block = text.split("The resume's answer says what the run stands for:\n\n```json\n", 1)[1].split("```", 1)[0]
    documented = json.loads(block)
    site = make_site()
    suspended(site, clock)
    answer = resume(site)
    assert documented["compacted"].keys() == answer["compacted"].keys()
    assert documented["compacted"]["covered"] == answer["compacted"]["covered"]
    assert {k: v for k, v in documented["compacted"].items() if k not in ("run_id",)} == {
        k: v for k, v in answer["compacted"].items() if k not in ("run_id",)
    }
    (slot,) = answer["caught_up"]
    shown = {k for k in documented["caught_up"][0] if k != "..."}
    assert shown < slot.keys() and {k: slot[k] for k in shown} == {
        k: v for k, v in documented["caught_up"][0].items() if k != "..."
    }
