"""Every ordering of two and of three attempts' protocol steps, with a stepped clock.

Each attempt claims, (renews,) and finishes (complete or release); a clock
step that ends every lease can fall anywhere in between.  For every ordering:
- never two completions of one run;
- a stale attempt never changes the record;
- once every attempt is gone, no record stays in progress past its lease
  (the next delivery can take the run over).
"""

from __future__ import annotations

import itertools

import pytest

from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import Claimed, Finished, Released, Renewed, Replayed, Stale
from models import RunRecord, RunStatus

LEASE = 60
POLICY = RunPolicy(lease_seconds=LEASE, retention_seconds=10 * 24 * 3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="j", scheduler_job_name="j")


def interleavings(sequences: dict[str, list[str]]):
    """All merges of the sequences that keep each one's own order."""
    names = [name for name, steps in sequences.items() for _ in steps]
    for order in sorted(set(itertools.permutations(names))):
        cursors = dict.fromkeys(sequences, 0)
        merged = []
        for name in order:
            merged.append((name, sequences[name][cursors[name]]))
            cursors[name] += 1
        yield merged


def snapshot(run_id):
    record = RunRecord.get_by_id(run_id)
    return None if record is None else record.to_dict()


def play(ledger, clock, run_id, schedule):
    """Run one ordering; check the safety properties at every step."""
    owned: dict[str, object] = {}  # attempt name -> Attempt, while it believes it owns the run
    owner: str | None = None  # the model: the last successful claimer, until it finishes
    completions = 0
    for actor, step in schedule:
        if actor == "clock":
            clock.advance(LEASE + 1)
            continue
        if step == "claim":
            outcome = ledger.claim_run(run_id, DESCRIPTION, POLICY)
            if isinstance(outcome, Claimed):
                owned[actor] = outcome.attempt
                owner = actor
            continue
        attempt = owned.get(actor)
        if attempt is None:
            continue  # this delivery did not get the run (409 / duplicate): it is gone
        stale = owner != actor  # taken over since its claim, or the run was finished by another
        before = snapshot(run_id)
        if not stale and step in ("complete", "release"):
            owner = None
        if step == "renew":
            outcome = ledger.renew_lease(attempt, LEASE)
        elif step == "complete":
            outcome = ledger.complete_run(attempt, {"by": actor}, POLICY)
            del owned[actor]
        else:  # release
            outcome = ledger.release_run(attempt, {"message": "transient"})
            del owned[actor]
        if stale:
            assert isinstance(outcome, Stale), (schedule, actor, step, outcome)
            assert snapshot(run_id) == before, (schedule, actor, step)
        else:
            assert isinstance(outcome, (Renewed, Finished, Released)), (schedule, actor, step, outcome)
        if isinstance(outcome, Finished):
            completions += 1
            assert completions == 1, schedule
    # Every attempt is gone now: after one more lease, the run can be taken over or is finished.
    clock.advance(LEASE + 1)
    final = ledger.claim_run(run_id, DESCRIPTION, POLICY)
    assert isinstance(final, (Claimed, Replayed)), (schedule, final)
    if isinstance(final, Replayed):
        assert completions == 1
    return completions


def scenarios(attempt_steps: dict[str, list[list[str]]]):
    names = list(attempt_steps)
    for choice in itertools.product(*(attempt_steps[n] for n in names)):
        sequences = dict(zip(names, choice))
        sequences["clock"] = ["expire"]
        yield from interleavings(sequences)


def test_every_ordering_of_two_attempts(ndb_context, clock):
    ledger = Ledger(clock)
    played = 0
    steps = [["claim", "renew", "complete"], ["claim", "renew", "release"]]
    for number, schedule in enumerate(scenarios({"A": steps, "B": steps})):
        play(ledger, clock, f"two-{number}", schedule)
        played += 1
    assert played == 4 * 140  # 4 finish combinations x 7!/(3!3!1!) orderings


def test_every_ordering_of_three_attempts(ndb_context, clock):
    ledger = Ledger(clock)
    played = 0
    steps = [["claim", "complete"], ["claim", "release"]]
    for number, schedule in enumerate(scenarios({"A": steps[:1], "B": steps, "C": steps[:1]})):
        play(ledger, clock, f"three-{number}", schedule)
        played += 1
    assert played == 2 * 630  # 2 finish combinations x 7!/(2!2!2!1!) orderings


def test_the_checker_catches_a_protocol_without_a_fence(ndb_context, clock):
    """The properties can fail: a completion that skips the fence breaks them."""

    class Unfenced(Ledger):
        def complete_run(self, attempt, result, policy):
            record = RunRecord.get_by_id(attempt.run_id)
            record.status, record.result = RunStatus.COMPLETED.value, result
            record.put()
            return Finished(record)

    schedule = [("A", "claim"), ("clock", "expire"), ("B", "claim"), ("B", "complete"), ("A", "complete")]
    with pytest.raises(AssertionError):
        play(Unfenced(clock), clock, "unfenced", schedule)
