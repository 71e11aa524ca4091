"""Issue 24 §8: a day of schedule states, on the emulator, with the Cloud Tasks and Cloud Scheduler stand-ins.

The day itself is devtools/schedule_day.py: one hourly job through a fresh deploy, a Force
run of each kind, a pause with catch-up (its tasks delivered twice, and Scheduler's own late
retry of a caught-up slot), a late run and a failure streak.  Here it is played in-process
(webtest, a ManualClock); tests/test_simulated_day.py plays it on gunicorn.  The listing and
the audit's lines must agree with what the day did.
"""

from __future__ import annotations

import collections
import copy
import random

import pytest

from devtools import schedule_day
from devtools.effect_sink import EffectSink, Faults
from tests.support.schedule_sites import InProcessDaySite


@pytest.fixture
def sink():
    running = EffectSink(Faults(transient=0, slow=0), slow_seconds=0, rng=random.Random(1))
    yield running
    running.server.shutdown()
    running.server.server_close()


def test_a_day_of_schedule_states(cloud_tasks, google, ndb_client, tmp_path, clock, monkeypatch, sink, measured):
    monkeypatch.setenv("DEDUP_SCHEDULER_API_BASE", google.url)
    site = InProcessDaySite(tmp_path, sink.url, clock, ndb_client)
    day = schedule_day.play(site, sink, cloud_tasks)
    assert schedule_day.disagreements(day) == []
    # Issue 41 §1: the metrics counted each slot once, as the listing has it, outcome by outcome.
    counted = measured.counts("dedup.slot.outcomes", by="outcome", scheduler_job=schedule_day.SCHEDULER_JOB)
    assert slot_outcomes(counted) == listed_outcomes(day.statuses)
    assert counted.get("duplicate") == 1  # Scheduler's late retry of 07:00; a task's second delivery is none
    by_source = measured.counts("dedup.slot.outcomes", by="source", scheduler_job=schedule_day.SCHEDULER_JOB)
    assert by_source == {"scheduler": 7 + 1, "slot_run": 4, "audit": 1}  # 7 runs and the duplicate; 05:00-08:00; late
    runs, _ = measured.histogram("dedup.slot.attempts", scheduler_job=schedule_day.SCHEDULER_JOB)
    assert runs == 11  # every slot that ran or failed, once: never per delivery
    assert google.scheduler_states[schedule_day.JOB_PATH] == "ENABLED"  # paused at 04:30, resumed at 08:30
    # The check can fail: each kind of wrong answer, put into this day that went right, is named.
    for spoil, complaint in SPOILS:
        spoiled = copy.deepcopy(day)
        spoil(spoiled)
        assert [complaint in problem for problem in schedule_day.disagreements(spoiled)] == [True], complaint


# What each of the listing's statuses is counted as (schedules/metrics.py): a late slot ran, and was late.
COUNTED_AS = {"completed": ["ran"], "late": ["ran", "late"], "untracked": [], "unknown": []}


def listed_outcomes(statuses):
    """The outcomes the listing's slots add up to: the slot table's own count."""
    found = collections.Counter()
    for status in statuses.values():
        found.update(COUNTED_AS.get(status, [status]))
    return dict(found)


def slot_outcomes(counted):
    """The metric's outcomes, with ran once and ran after more attempts as one "ran", as the listing has no attempts."""
    found = collections.Counter()
    for outcome, value in counted.items():
        if outcome != "duplicate":
            found["ran" if outcome.startswith("ran_") else outcome] += value
    return dict(found)


def test_the_outcomes_compared_can_differ():
    listed = {"a": "completed", "b": "late", "c": "failed", "d": "untracked", "e": "paused"}
    assert listed_outcomes(listed) == {"ran": 2, "late": 1, "failed": 1, "paused": 1}
    assert slot_outcomes({"ran_once": 1, "ran_after_retries": 1, "late": 1, "failed": 1, "duplicate": 3}) == {
        "ran": 2,
        "late": 1,
        "failed": 1,
    }
    assert slot_outcomes({"ran_once": 2, "paused": 1}) != listed_outcomes(listed)


def _unscheduled_manual(day):
    day.unscheduled[0]["source"] = "manual"


SPOILS = [
    (lambda day: day.statuses.update({schedule_day.at(0): "missed"}), "the listing disagrees"),
    (lambda day: day.received.update({schedule_day.at(7): 2}), "reached the downstream other than once"),
    (lambda day: day.applied.update({schedule_day.at(9): 1}), "effects per slot"),
    (lambda day: day.forced_applied.append(1), "Force runs took effect"),
    (_unscheduled_manual, "no Force runs"),
    (lambda day: day.unscheduled.pop(), "not what the listing shows apart"),
    (lambda day: day.caught_up.pop(), "the resume caught up"),
    (lambda day: day.task_answers[0].pop(), "not every task was delivered twice"),
    (lambda day: day.audit.append(schedule_day.AuditLine("WARNING", "missed", None)), "reported a slot missed"),
    (lambda day: day.audit.append(schedule_day.AuditLine("ERROR", "late", None)), "ERROR lines"),
    (lambda day: setattr(day, "late_retry", (409, None)), "late retry"),
]
