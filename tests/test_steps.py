"""Steps that survive a takeover (dedup/steps.py): the rules, kills between step events, stale
attempts, reviews, and thousands of random kill schedules (devtools/step_simulator.py).

The decision table needs no database.  The kills run on the real ledger over the in-memory store
(every kill point, and every pair of kill points over two attempts) and over both emulators
(every kill point, a stale attempt, a review): the fenced write is the database's own there.
"""

from __future__ import annotations

import itertools
import json
import logging

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup import steps as steps_module
from dedup.clock import ManualClock
from dedup.errors import PermanentJobError
from dedup.finished_cache import FinishedRuns
from dedup.memory_store import MemoryStore
from dedup.outcomes import Finished, Renewed, Stale
from dedup.run_record import RunStatus
from dedup.steps import (
    MAX_STEP_RESULT_BYTES,
    Call,
    OnUnknown,
    Replay,
    Semantic,
    StepDecision,
    StepState,
    Unknown,
    decide,
    review_step,
    step_key,
    step_rows,
)
from devtools.step_simulator import (
    LEASE,
    STEPS,
    Downstream,
    EventLedger,
    Events,
    Killed,
    deliver,
    simulate,
    three_steps,
)
from jobs.base import RunContext

AT_LEAST, AT_MOST = Semantic.AT_LEAST_ONCE, Semantic.AT_MOST_ONCE


@pytest.fixture
def offline():
    client = ndb.Client(project="steps", credentials=AnonymousCredentials())
    with client.context():
        yield


@pytest.fixture
def memory_ledger(offline):
    memory = MemoryStore()
    return EventLedger(ManualClock(), FinishedRuns(0), store=lambda: memory)


@pytest.fixture
def emulator_ledger(ndb_context):
    return EventLedger(ManualClock(), FinishedRuns(0))


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR)  # every kill and takeover logs a warning


# -- the decision table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "semantic", "on_unknown", "expected"),
    [
        (None, AT_LEAST, OnUnknown.FAIL, Call(record_started=False)),
        (None, AT_MOST, OnUnknown.REVIEW, Call(record_started=True)),
        ({"state": "done", "result": {"n": 1}}, AT_LEAST, OnUnknown.FAIL, Replay({"n": 1})),
        ({"state": "done", "result": None}, AT_MOST, OnUnknown.RETRY, Replay(None)),
        ({"state": "started", "attempt": 2}, AT_LEAST, OnUnknown.FAIL, Call(record_started=False)),
        ({"state": "started", "attempt": 2}, AT_MOST, OnUnknown.FAIL, Unknown(OnUnknown.FAIL, 2)),
        ({"state": "started", "attempt": 3}, AT_MOST, OnUnknown.REVIEW, Unknown(OnUnknown.REVIEW, 3)),
        ({"state": "started", "attempt": 3}, AT_MOST, OnUnknown.RETRY, Call(record_started=True)),
        ({"state": "rerun", "attempt": 3}, AT_MOST, OnUnknown.REVIEW, Call(record_started=True)),
        ({"state": "rerun", "attempt": 3}, AT_LEAST, OnUnknown.FAIL, Call(record_started=False)),
    ],
)
def test_what_a_step_does_given_its_record(recorded, semantic, on_unknown, expected):
    assert decide(recorded, semantic, on_unknown) == expected


def test_a_steps_key_is_the_run_id_and_its_name():
    assert step_key("a" * 64, "charge") == "a" * 64 + ":charge"


def unheld_context(records=None) -> RunContext:
    from dedup.outcomes import Attempt

    return RunContext.for_attempt(Attempt("r" * 64, "attempt-id", 2, step_records=records), "job")


@pytest.mark.parametrize("name", ["", "with space", "a:b", "x" * 65, "-lead", "é", None, 7])
def test_a_bad_step_name_is_a_permanent_error_naming_the_rule(name):
    with pytest.raises(PermanentJobError, match="step's name"):
        unheld_context().step(name, lambda key: None)


@pytest.mark.parametrize(
    ("semantic", "on_unknown", "words"),
    [
        ("at_most_once", None, "needs its on_unknown"),
        ("at_least_once", "fail", "on_unknown is for at_most_once"),
        ("exactly_once", None, "at_least_once or at_most_once"),
        ("at_most_once", "ignore", "fail, review or retry"),
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_called(semantic, on_unknown, words):
    called = []
    with pytest.raises(PermanentJobError, match=words):
        unheld_context().step("s", called.append, semantic=semantic, on_unknown=on_unknown)
    assert called == []


def test_a_result_larger_than_the_bound_is_refused_not_truncated():
    context = unheld_context()
    exact = "x" * (MAX_STEP_RESULT_BYTES - 2)  # JSON adds the quotes
    assert context.step("fits", lambda key: exact) == exact
    with pytest.raises(PermanentJobError, match=f"at most {MAX_STEP_RESULT_BYTES} bytes"):
        context.step("too-big", lambda key: exact + "x")
    with pytest.raises(PermanentJobError, match="not JSON"):
        context.step("not-json", lambda key: {1, 2})


def test_a_step_name_used_twice_in_one_attempt_is_refused():
    context = unheld_context()
    context.step("once", lambda key: 1)
    with pytest.raises(PermanentJobError, match="ran twice in one attempt"):
        context.step("once", lambda key: 2)


def test_a_recorded_step_is_replayed_and_the_call_gets_the_steps_key():
    context = unheld_context({"done-before": {"state": "done", "result": [1, 2], "attempt": 1}})
    keys = []
    assert context.step("done-before", keys.append) == [1, 2]
    assert context.step("new", lambda key: keys.append(key) or "ok") == "ok"
    assert keys == ["r" * 64 + ":new"]


def test_step_rows_say_state_attempt_duration_and_key():
    rows = step_rows(
        {
            "b": {"state": "started", "attempt": 2, "started": "2030-01-01T00:00:05.000000Z", "finished": None},
            "a": {
                "state": "done",
                "attempt": 1,
                "semantic": "at_least_once",
                "started": "2030-01-01T00:00:00.000000Z",
                "finished": "2030-01-01T00:00:01.500000Z",
            },
        },
        "run",
    )
    assert [(r["name"], r["state"], r["attempt"], r["seconds"], r["key"]) for r in rows] == [
        ("a", "done", 1, 1.5, "run:a"),
        ("b", "started", 2, None, "run:b"),
    ]


# -- kills between step events ----------------------------------------------------------------


def clean_events(ledger: EventLedger) -> list[str]:
    """The events of one attempt that runs through, in order."""
    events = Events()
    ledger.events = events
    outcome = deliver(ledger, ledger.clock, "clean", three_steps(Downstream(), events))
    assert isinstance(outcome, Finished) and outcome.record.status == RunStatus.COMPLETED
    return [event.split(":", 1)[1] for event in events.seen]


def run_until_final(ledger: EventLedger, run_id: str, kills: list[str | None]) -> tuple[Downstream, object]:
    """Deliver the run, attempt n dying at ``kills[n-1]`` (None: it runs through), until it ends."""
    downstream, events = Downstream(), Events()
    ledger.events = events
    job = three_steps(downstream, events)
    for number in itertools.count(1):
        kill = kills[number - 1] if number <= len(kills) else None
        events.kill_at = f"{number}:{kill}" if kill else None
        try:
            outcome = deliver(ledger, ledger.clock, run_id, job)
        except Killed:
            ledger.clock.advance(LEASE + 1)
            continue
        record = ledger.lookup(run_id)
        assert record is not None and record.status != RunStatus.IN_PROGRESS, outcome
        return downstream, record
    raise AssertionError("unreachable")


def check_once_or_review(downstream: Downstream, record) -> None:
    """Each step took effect once and the run completed, or it waits for a review of the charge
    with the charge called at most once.  Never twice."""
    assert all(downstream.applied[name] <= 1 for name, *_ in STEPS), downstream
    assert downstream.calls["charge"] <= 1
    if record.status == RunStatus.COMPLETED:
        assert all(downstream.applied[name] == 1 for name, *_ in STEPS), downstream
        assert {name for name, entry in record.steps.items() if entry["state"] == "done"} == {n for n, *_ in STEPS}
    else:
        assert record.status == RunStatus.FAILED and review_step(record) is not None, record.error
        assert review_step(record)["step"] == "charge"
        assert record.steps["charge"]["state"] == "started"
        assert downstream.applied["notify"] == 0  # nothing after the unknown step ran


def test_a_kill_between_every_pair_of_step_events_resumes_from_the_last_recorded_step(memory_ledger):
    events = clean_events(memory_ledger)
    assert len(events) == 15  # 4 + 6 + 4 step events and the finish
    for at in events:
        downstream, record = run_until_final(memory_ledger, f"kill-{at}", [at])
        check_once_or_review(downstream, record)
        # A step recorded before the kill was not called again.
        killed_after = events[: events.index(at)]
        for name, *_ in STEPS:
            if f"{name}:done:written" in killed_after:
                assert downstream.calls[name] == 1, (at, name)
        # Only a kill between the charge's "started" and its result leaves it unknown.
        unknown = events.index("charge:started:written") <= events.index(at) <= events.index("charge:done:write")
        assert (record.status == RunStatus.FAILED) == unknown, at


@pytest.mark.exhaustive
def test_two_attempts_killed_at_every_pair_of_points(memory_ledger):
    events = clean_events(memory_ledger)
    reviews = 0
    for first, second in itertools.product(events, repeat=2):
        downstream, record = run_until_final(memory_ledger, f"kill-{first}-{second}", [first, second])
        check_once_or_review(downstream, record)
        reviews += record.status == RunStatus.FAILED
    assert 0 < reviews < len(events) ** 2


@pytest.mark.both_emulators
def test_every_kill_point_on_the_emulator(emulator_ledger):
    events = clean_events(emulator_ledger)
    for at in events:
        downstream, record = run_until_final(emulator_ledger, f"kill-{at}", [at])
        check_once_or_review(downstream, record)


# -- a stale attempt --------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["reserve:effected", "charge:effected", "notify:effect"])
def test_a_stale_attempt_cannot_record_a_step_after_a_takeover(request, at, memory_ledger):
    stale_attempt_is_refused(memory_ledger, at)


@pytest.mark.both_emulators
def test_a_stale_attempt_is_refused_on_the_emulator(emulator_ledger):
    stale_attempt_is_refused(emulator_ledger, "reserve:effected")


def stale_attempt_is_refused(ledger: EventLedger, at: str) -> None:
    downstream, events = Downstream(), Events()
    ledger.events = events
    job = three_steps(downstream, events)
    run_id = f"stale-{at}"
    seen: dict[str, object] = {}

    def takeover() -> None:  # attempt 1 is paused mid-step; its lease runs out and attempt 2 runs
        ledger.clock.advance(LEASE + 1)
        seen["takeover"] = deliver(ledger, ledger.clock, run_id, job)
        seen["record"] = ledger.lookup(run_id)

    events.hooks = {f"1:{at}": takeover}
    outcome = deliver(ledger, ledger.clock, run_id, job)
    assert isinstance(outcome, Stale)  # attempt 1 woke, tried to record its step and stopped
    after = ledger.lookup(run_id)
    before = seen["record"]
    assert (after.attempt, after.status, after.steps) == (before.attempt, before.status, before.steps)
    # Attempt 1's next write after the takeover was refused, and it wrote nothing after that.
    resumed = [e for e in events.seen[events.seen.index(f"1:{at}") + 1 :] if e.startswith("1:")]
    assert [e.rsplit(":", 1)[1] for e in resumed if e.endswith(("write", "written", "refused"))] == [
        "write",
        "refused",
    ], resumed
    name = at.split(":")[0]
    assert after.steps[name]["attempt"] == 2 or after.status == RunStatus.FAILED
    check_once_or_review(downstream, after)


# -- on_unknown, review and its settling --------------------------------------------------------


def killed_in_charge(ledger: EventLedger, run_id: str, on_unknown: str) -> tuple[Downstream, object]:
    """A run whose charge took effect, then the attempt died before recording it; delivered again."""
    downstream, events = Downstream(), Events()
    ledger.events = events

    def job(context: RunContext):
        def charge(key: str):
            done = downstream.call("charge", key, False)
            events(f"{context.attempt}:charge:effected")
            return done

        context.step("reserve", lambda key: downstream.call("reserve", key, True))
        return context.step("charge", charge, semantic="at_most_once", on_unknown=on_unknown)

    events.kill_at = "1:charge:effected"
    with pytest.raises(Killed):
        deliver(ledger, ledger.clock, run_id, job)
    ledger.clock.advance(LEASE + 1)
    deliver(ledger, ledger.clock, run_id, job)
    return downstream, ledger.lookup(run_id)


def test_on_unknown_fail_fails_the_run_for_good_naming_the_step(memory_ledger):
    downstream, record = killed_in_charge(memory_ledger, "fail", "fail")
    assert record.status == RunStatus.FAILED
    assert record.error["details"] == {"step": "charge", "attempt": 1, "key": "fail:charge"}
    assert "on_unknown is fail" in record.error["message"]
    assert review_step(record) is None  # failed, not waiting for anyone
    assert downstream.calls["charge"] == 1


def test_on_unknown_retry_calls_the_step_again_on_purpose(memory_ledger):
    downstream, record = killed_in_charge(memory_ledger, "retry", "retry")
    assert record.status == RunStatus.COMPLETED
    assert downstream.calls["charge"] == 2
    assert record.steps["charge"] | {"started": None, "finished": None} == {
        "state": "done",
        "semantic": "at_most_once",
        "attempt": 2,
        "started": None,
        "finished": None,
        "result": {"step": "charge", "key": "retry:charge"},
    }


@pytest.mark.parametrize("decision", [StepState.DONE, StepState.RERUN])
def test_a_review_marks_the_step_done_or_runs_it_again_then_the_run_resumes(memory_ledger, decision):
    ledger = memory_ledger
    downstream, record = killed_in_charge(ledger, f"review-{decision}", "review")
    assert review_step(record) == {"step": "charge", "attempt": 1, "key": f"review-{decision}:charge"}
    assert record.error["type"] == "NeedsReview"
    by = "user:ops@example.com"
    settled = ledger.settle_step(record.run_id, StepDecision("charge", decision, record.attempt, by, {"ref": "ch_1"}))
    assert not isinstance(settled, str), settled
    assert settled.status == RunStatus.FAILED and settled.steps["charge"]["settled_by"] == by
    # The same decision again (a lost answer tried again) is the same; another is refused.
    assert not isinstance(ledger.settle_step(record.run_id, StepDecision("charge", decision, 2, by)), str)
    other = StepState.RERUN if decision == StepState.DONE else StepState.DONE
    assert "already marked" in ledger.settle_step(record.run_id, StepDecision("charge", other, 2, "user:b@example.com"))
    downstream_before = downstream.calls["charge"]

    def job(context: RunContext):
        context.step("reserve", lambda key: downstream.call("reserve", key, True))
        return context.step(
            "charge", lambda key: downstream.call("charge", key, False), semantic="at_most_once", on_unknown="review"
        )

    ledger.events = Events()
    outcome = deliver(ledger, ledger.clock, record.run_id, job, reopen_attempt=record.attempt)
    assert isinstance(outcome, Finished) and outcome.record.status == RunStatus.COMPLETED
    assert downstream.calls["reserve"] == 1  # recorded at attempt 1: never called again
    if decision == StepState.DONE:
        assert outcome.record.result == {"ref": "ch_1"}  # the operator's result stands for the step's
        assert downstream.calls["charge"] == downstream_before
    else:
        assert downstream.calls["charge"] == downstream_before + 1


def test_a_review_that_does_not_match_the_run_is_refused(memory_ledger):
    ledger = memory_ledger
    _, record = killed_in_charge(ledger, "refused", "review")
    by = "user:ops@example.com"
    assert "attempt 2, not 1" in ledger.settle_step("refused", StepDecision("charge", StepState.DONE, 1, by))
    assert "not 'reserve'" in ledger.settle_step("refused", StepDecision("reserve", StepState.DONE, 2, by))
    too_big = "x" * MAX_STEP_RESULT_BYTES
    assert "at most" in ledger.settle_step("refused", StepDecision("charge", StepState.DONE, 2, by, too_big))
    assert "no run" in ledger.settle_step("absent", StepDecision("charge", StepState.DONE, 2, by))
    assert ledger.lookup("refused").steps["charge"]["state"] == "started"  # nothing was written


@pytest.mark.both_emulators
def test_a_review_on_the_emulator(emulator_ledger):
    downstream, record = killed_in_charge(emulator_ledger, "review", "review")
    assert review_step(record)["step"] == "charge"
    decision = StepDecision("charge", StepState.DONE, record.attempt, "user:ops@example.com", None)
    assert not isinstance(emulator_ledger.settle_step("review", decision), str)
    assert emulator_ledger.lookup("review").steps["charge"]["state"] == "done"


def test_steps_are_kept_in_the_runs_record_and_go_with_it(memory_ledger):
    ledger = memory_ledger
    downstream, record = run_until_final(ledger, "kept", [])
    assert set(record.steps) == {"reserve", "charge", "notify"}
    # Past its expiry the record is absent: a new run of the key starts with no steps.
    ledger.clock.advance((record.expire_at - ledger.clock.now()).total_seconds() + 1)
    downstream_again, again = run_until_final(ledger, "kept", [])
    assert all(downstream_again.calls[name] == 1 for name, *_ in STEPS)  # every step ran afresh
    assert {entry["attempt"] for entry in again.steps.values()} == {again.attempt}


# -- thousands of random kill schedules ----------------------------------------------------------


@pytest.mark.exhaustive
def test_thousands_of_random_kill_schedules_take_each_step_once(memory_ledger):
    found = simulate(memory_ledger, memory_ledger.clock, 2000, seed=42)
    assert [s.broken for s in found if s.broken] == []
    # The schedules did what they are for: kills, stale wakes and both kinds of review.
    assert sum(s.kills for s in found) > 2000
    assert sum(s.stale_wakes for s in found) > 100
    assert sum(s.reruns for s in found) > 100 and sum(s.reviews - s.reruns for s in found) > 100


@pytest.mark.both_emulators
def test_random_kill_schedules_on_the_emulator(emulator_ledger):
    found = simulate(emulator_ledger, emulator_ledger.clock, 40, seed=7)
    assert [s.broken for s in found if s.broken] == []


def test_the_simulator_finds_an_at_most_once_step_called_again_silently(memory_ledger, monkeypatch):
    """The evidence can fail: with at_most_once steps called again instead of reviewed, it says so."""

    def retry_always(recorded, semantic, rule):
        return decide(recorded, semantic, OnUnknown.RETRY)

    monkeypatch.setattr(steps_module, "decide", retry_always)
    found = simulate(memory_ledger, memory_ledger.clock, 300, seed=42)
    assert any("charge took effect 2 times" in " ".join(s.broken) for s in found)


def test_the_simulator_finds_a_step_whose_result_is_not_replayed(memory_ledger, monkeypatch):
    monkeypatch.setattr(steps_module, "decide", lambda recorded, semantic, rule: Call(semantic == AT_MOST))
    found = simulate(memory_ledger, memory_ledger.clock, 300, seed=42)
    assert any("took effect 2 times" in " ".join(s.broken) for s in found)


def test_a_run_records_no_more_than_its_budget_of_steps():
    context = unheld_context()
    for number in range(steps_module.MAX_STEPS):
        context.step(f"s{number}", lambda key: None)
    with pytest.raises(PermanentJobError, match=f"at most {steps_module.MAX_STEPS} steps"):
        context.step("one-more", lambda key: None)
    assert len(json.dumps(context.steps().recorded())) < steps_module.MAX_STEPS_JSON_BYTES


def test_a_call_that_surely_did_not_act_is_recorded_as_not_taken_and_called_again_without_review(memory_ledger):
    ledger, calls = memory_ledger, []

    def job(context: RunContext):
        def charge(key: str):
            calls.append(context.attempt)
            if context.attempt == 1:
                raise steps_module.StepNotTaken(ConnectionRefusedError("never connected"))
            return "charged"

        return context.step("charge", charge, semantic="at_most_once", on_unknown="review")

    ledger.events = Events()
    first = deliver(ledger, ledger.clock, "not-taken", job)
    assert first.record.status == RunStatus.RELEASED  # the cause, ConnectionRefusedError: retryable
    assert first.record.error["type"] == "ConnectionRefusedError"
    assert first.record.steps["charge"]["state"] == "rerun"
    again = deliver(ledger, ledger.clock, "not-taken", job)
    assert again.record.status == RunStatus.COMPLETED and again.record.result == "charged"
    assert calls == [1, 2]


def test_the_simulator_command_reports_its_schedules(capsys):
    from devtools import step_simulator

    assert step_simulator.main(["--schedules", "60", "--seed", "3"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("60 schedules, {") and said.rstrip().endswith(": 0 broken")


# -- what an earlier attempt recorded, and whose it is -----------------------------------------


def test_a_released_run_with_steps_is_never_skipped_over(memory_ledger):
    """A late delivery's skip writes a skipped record, which would forget the steps: a run that
    recorded a step is resumed instead, as one that started something downstream is."""
    from dedup.claims import ClaimRequest
    from dedup.outcomes import Claimed, Skipped
    from devtools.step_simulator import DESCRIPTION, POLICY

    ledger = memory_ledger
    ledger.events = Events()
    claimed = ledger.claim_run("resumed", DESCRIPTION, POLICY)
    assert isinstance(ledger.record_step(claimed.attempt, "reserve", {"state": "done", "attempt": 1}), Renewed)
    ledger.release_run(claimed.attempt, {"type": "Boom"})
    late = ClaimRequest("resumed", DESCRIPTION, POLICY, skip_reason="later than max_delay_seconds")
    outcome = ledger._claim_in_transaction(late, store=ledger.store())
    assert isinstance(outcome, Claimed) and not isinstance(outcome, Skipped)
    assert outcome.attempt.step_records["reserve"]["state"] == "done"


def test_a_token_reused_with_other_parameters_starts_afresh(memory_ledger):
    """Over a released run, a client token sent with other parameters is another request: it gets
    neither the first request's steps nor what it started downstream."""
    import dataclasses

    from devtools.step_simulator import DESCRIPTION, POLICY

    ledger = memory_ledger
    ledger.events = Events()
    first = dataclasses.replace(DESCRIPTION, fingerprint="parameters-a")
    claimed = ledger.claim_run("token", first, POLICY)
    ledger.record_step(claimed.attempt, "charge", {"state": "done", "attempt": 1, "result": "ch_a"})
    ledger.record_downstream(claimed.attempt, "projects/p/executions/a")
    ledger.release_run(claimed.attempt, {"type": "Boom"})
    same = ledger.claim_run("token", first, POLICY)
    assert same.attempt.step_records["charge"]["result"] == "ch_a" and same.attempt.downstream is not None
    ledger.release_run(same.attempt, {"type": "Boom"})
    other = ledger.claim_run("token", dataclasses.replace(DESCRIPTION, fingerprint="parameters-b"), POLICY)
    assert other.attempt.step_records is None and other.attempt.downstream is None
    assert other.record.steps is None


def test_a_job_that_swallows_stale_attempt_calls_nothing_more(memory_ledger):
    ledger, calls = memory_ledger, []
    ledger.events = Events()

    def job(context: RunContext):
        for name in ("one", "two", "three"):
            try:
                context.step(name, lambda key, name=name: calls.append((context.attempt, name)))
            except Exception:  # a careless job: it catches everything and goes on
                pass
            if name == "one" and context.attempt == 1:  # paused here; its lease runs out, attempt 2 runs
                ledger.clock.advance(LEASE + 1)
                deliver(ledger, ledger.clock, "swallowed", job)
        return "done anyway"

    outcome = deliver(ledger, ledger.clock, "swallowed", job)
    assert isinstance(outcome, Stale)  # attempt 1 finished nothing
    # Attempt 1 called "one", then lost the run: its "two" was refused at the write... and its
    # "three" was never called at all.  Attempt 2 ran "two" and "three" once each.
    assert calls.count((1, "three")) == 0
    assert [c for c in calls if c[0] == 2] == [(2, "two"), (2, "three")]
    record = ledger.lookup("swallowed")
    assert record.status == RunStatus.COMPLETED and record.attempt == 2


def test_a_steps_result_is_the_same_value_on_its_first_attempt_and_on_replay():
    context = unheld_context()
    first = context.step("shape", lambda key: {"pair": (1, 2), 3: "three"})
    replayed = unheld_context({"shape": {"state": "done", "result": first}}).step("shape", lambda key: None)
    assert first == replayed == {"pair": [1, 2], "3": "three"}
