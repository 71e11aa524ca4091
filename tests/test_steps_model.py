"""A model of one step's state machine, checked against the ledger over every ordering.

Two deliveries of one run (A and B) each claim, begin the step (decide, and for at_most_once
record ``started``), call its effect, record its result and finish; one clock tick of exactly
a lease falls anywhere between.  Every ordering of those eleven moves (2,772) is played on the
real ledger (over the in-memory store: the same decisions as Datastore, at the process's
speed) beside a small model written apart from dedup.steps, which predicts each move's outcome
exactly: a claim is Claimed, InProgress or Replayed; a step write lands only while its attempt
owns the run, else it is Stale and that attempt stops; what a claimed attempt decides about the
step follows from the record it claimed.  And at the end: the effect was called as many times as
the model says, which for at_most_once with ``review`` or ``fail`` is never twice.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup.clock import ManualClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.memory_store import MemoryStore
from dedup.outcomes import Claimed, Finished, InProgress, Renewed, Replayed, Stale
from dedup.run_record import RunStatus
from dedup.steps import Call, OnUnknown, Replay, Semantic, Unknown, decide

LEASE = 60
POLICY = RunPolicy(lease_seconds=LEASE, retention_seconds=86400)
DESCRIPTION = RunDescription(source="scheduler", job_id="j", scheduler_job_name="j")
MOVES = ("claim", "begin", "effect", "record", "finish")
RULES = [
    (Semantic.AT_LEAST_ONCE, OnUnknown.FAIL),
    (Semantic.AT_MOST_ONCE, OnUnknown.REVIEW),
    (Semantic.AT_MOST_ONCE, OnUnknown.FAIL),
    (Semantic.AT_MOST_ONCE, OnUnknown.RETRY),
]


@dataclasses.dataclass
class Model:
    """What the protocol should do with one step, written apart from dedup.steps."""

    semantic: Semantic
    rule: OnUnknown
    now: int = 0
    attempts: int = 0
    owner: str | None = None
    lease_until: int = 0
    status: str | None = None  # in_progress, completed, failed
    step: tuple[str, int] | None = None  # (state, attempt) as recorded
    effects: int = 0
    # Per delivery: its attempt number, what it saw of the step at its claim, what it does.
    number: dict[str, int] = dataclasses.field(default_factory=dict)
    seen: dict[str, tuple[str, int] | None] = dataclasses.field(default_factory=dict)
    plan: dict[str, str] = dataclasses.field(default_factory=dict)  # call, call-started, replay, unknown
    gone: set[str] = dataclasses.field(default_factory=set)

    def claim(self, actor: str) -> type:
        if self.status in ("completed", "failed"):
            self.gone.add(actor)
            return Replayed
        if self.status == "in_progress" and self.lease_until > self.now:
            self.gone.add(actor)
            return InProgress
        self.attempts += 1
        self.owner, self.lease_until, self.status = actor, self.now + LEASE, "in_progress"
        self.number[actor], self.seen[actor] = self.attempts, self.step
        return Claimed

    def begin(self, actor: str) -> type | None:
        seen = self.seen[actor]
        at_most_once = self.semantic == Semantic.AT_MOST_ONCE
        if seen is not None and seen[0] == "done":
            self.plan[actor] = "replay"
            return None
        if seen is not None and seen[0] == "started" and at_most_once and self.rule != OnUnknown.RETRY:
            self.plan[actor] = "unknown"
            return None
        self.plan[actor] = "call"
        return self.write(actor, "started") if at_most_once else None

    def write(self, actor: str, state: str) -> type:
        if self.owner != actor or self.status != "in_progress":
            self.gone.add(actor)  # StaleAttempt: it stops
            return Stale
        self.step = (state, self.number[actor])
        return Renewed

    def effect(self, actor: str) -> None:
        if self.plan[actor] == "call":
            self.effects += 1

    def record(self, actor: str) -> type | None:
        return self.write(actor, "done") if self.plan[actor] == "call" else None

    def finish(self, actor: str) -> type:
        if self.owner != actor or self.status != "in_progress":
            self.gone.add(actor)
            return Stale
        self.status = "failed" if self.plan[actor] == "unknown" else "completed"
        self.owner = None
        return Finished


@pytest.fixture
def offline():
    with ndb.Client(project="steps-model", credentials=AnonymousCredentials()).context():
        yield


def orderings() -> list[tuple[str, ...]]:
    moves = ["A"] * len(MOVES) + ["B"] * len(MOVES) + ["tick"]
    return sorted(set(itertools.permutations(moves)))


ORDERINGS = orderings()


@pytest.mark.exhaustive
@pytest.mark.parametrize(("semantic", "rule"), RULES, ids=[f"{s}-{r}" for s, r in RULES])
def test_every_ordering_of_two_attempts_and_a_takeover_does_what_the_model_says(offline, caplog, semantic, rule):
    caplog.set_level(logging.ERROR)
    assert len(ORDERINGS) == 2772  # 11! / (5! 5! 1!)
    effect_counts = set()
    for number, order in enumerate(ORDERINGS):
        memory = MemoryStore()
        clock = ManualClock()
        ledger = Ledger(clock, FinishedRuns(0), store=lambda memory=memory: memory)
        model = Model(semantic, rule)
        run_id = f"run-{number}"
        held: dict[str, object] = {}
        moved = {"A": 0, "B": 0}
        for actor in order:
            if actor == "tick":
                clock.advance(LEASE)
                model.now += LEASE
                continue
            move = MOVES[moved[actor]]
            moved[actor] += 1
            if actor in model.gone:
                continue
            where = (order, actor, move)
            if move == "claim":
                outcome = ledger.claim_run(run_id, DESCRIPTION, POLICY)
                assert isinstance(outcome, model.claim(actor)), where
                if isinstance(outcome, Claimed):
                    held[actor] = outcome.attempt
                    recorded = (outcome.attempt.step_records or {}).get("s")
                    assert ((recorded["state"], recorded["attempt"]) if recorded else None) == model.seen[actor], where
                continue
            attempt = held[actor]
            if move == "begin":
                expected = model.begin(actor)
                decided = decide((attempt.step_records or {}).get("s"), semantic, rule)
                plan = {Replay: "replay", Unknown: "unknown"}.get(type(decided), "call")
                assert plan == model.plan[actor], where
                if isinstance(decided, Call) and decided.record_started:
                    outcome = ledger.record_step(attempt, "s", entry("started", attempt.number))
                    assert isinstance(outcome, expected), where
                else:
                    assert expected is None, where
            elif move == "effect":
                model.effect(actor)
            elif move == "record":
                expected = model.record(actor)
                if model.plan[actor] == "call":
                    assert isinstance(ledger.record_step(attempt, "s", entry("done", attempt.number)), expected), where
            elif move == "finish":
                expected = model.finish(actor)
                if model.plan[actor] == "unknown":
                    outcome = ledger.fail_run(attempt, {"type": "NeedsReview"}, POLICY)
                else:
                    outcome = ledger.complete_run(attempt, {"ok": True}, POLICY)
                assert isinstance(outcome, expected), where
        stored = ledger.lookup(run_id)
        recorded = (stored.steps or {}).get("s") if stored else None
        assert ((recorded["state"], recorded["attempt"]) if recorded else None) == model.step, order
        assert stored.status == (model.status if model.status != "in_progress" else RunStatus.IN_PROGRESS), order
        if semantic == Semantic.AT_MOST_ONCE and rule != OnUnknown.RETRY:
            assert model.effects <= 1, order  # never twice: the second attempt stops for a person
        if stored.status == RunStatus.COMPLETED:
            assert recorded is not None and recorded["state"] == "done", order
        effect_counts.add(model.effects)
    # The orderings reach every count the semantic allows: a takeover mid-step calls it again
    # unless it is at_most_once and asks for a person.
    assert effect_counts == ({1} if semantic == Semantic.AT_MOST_ONCE and rule != OnUnknown.RETRY else {1, 2})


def entry(state: str, attempt: int) -> dict[str, object]:
    return {"state": state, "attempt": attempt, "semantic": "x", "started": None, "finished": None, "result": None}
