"""Every ordering of two and of three attempts' protocol steps, with a stepped clock.

Each attempt claims, runs (notes what it started downstream, a fenced write),
renews its lease and finishes (complete, fail or release); two clock steps of
exactly one lease fall anywhere in between.  Each step is played against the
real ledger on the emulator and checked against a small model of the
protocol, which predicts every outcome exactly:
- a claim succeeds exactly when no live lease is held and the run has not
  finished (so two attempts never hold live leases at once; a lease ends at
  the instant it names), a refused claim writes nothing, and a takeover
  adopts what the previous attempt noted downstream;
- the owner's steps always land; a stale attempt (taken over since its
  claim, or after the run finished) gets ``Stale`` and never changes the
  record.  So only one finish lands: never two completions of one run;
- once every attempt is gone, no record stays in progress past its lease:
  one lease later the next delivery takes the run over, or replays the one
  completion (or failure).

The orderings are explored as a graph of states, not one by one.  Two
orderings that reach the same state (the steps each attempt has taken, the
stored record with its random attempt ids named after their attempts, the
attempts still holding a claim, the model, which also fixes the clock) have
the same futures, since that is everything a later step reads; so each
state's futures are played once.  The remaining steps of a delivery that did
not get the run (it has gone away) are counted, not played, and attempt
choices that are renamings of each other are explored once.  That makes
25,253,550 orderings cost about 11,000 ledger calls (``pytest -s`` prints
the count).  The test also counts the orderings the graph stands for against
the multinomial formula: that checks the counting, not the state key.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import itertools
import math

import pytest
from google.cloud import ndb

from dedup.clock import ManualClock
from dedup.finished_cache import FinishedRuns
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.memory_store import MemoryStore
from dedup.outcomes import Claimed, Finished, InProgress, Released, Renewed, Replayed, Stale
from models import RunRecord, RunStatus

pytestmark = pytest.mark.exhaustive

LEASE = 60
POLICY = RunPolicy(lease_seconds=LEASE, retention_seconds=10 * 24 * 3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="j", scheduler_job_name="j")
CLOCK = "clock"
EXPLORER_THREADS = 4
FINISHES = ("complete", "fail", "release")
DOWNSTREAM = "started-by-{}"
_CHANGED_BY_THE_END_CHECK = object()


@dataclasses.dataclass(frozen=True)
class Model:
    """What the protocol should have done so far, independent of the ledger's code."""

    now: int = 0  # seconds since the start
    owner: str | None = None  # the attempt holding the claim, until it finishes
    lease_until: int = 0
    attempts: int = 0  # the attempt counter of the record, released ones too (0: no record)
    downstream: str | None = None
    finished: str | None = None  # "completed" or "failed": replayed from now on

    def lease_is_live(self) -> bool:
        return self.owner is not None and self.now < self.lease_until


@dataclasses.dataclass(frozen=True)
class State:
    steps_taken: tuple[int, ...]  # per actor, in the order of the explorer's actors
    record: RunRecord | None  # as stored after the last step
    held: tuple[tuple[str, object], ...]  # (actor, Attempt) for attempts that think they own the run
    model: Model
    names: tuple[tuple[str, str], ...]  # attempt_id -> actor


class Explorer:
    """Plays every ordering of the actors' steps, one state at a time."""

    def __init__(self, ledger: Ledger, clock, run_id: str, sequences: dict[str, list[str]]) -> None:
        self.ledger, self.clock, self.run_id = ledger, clock, run_id
        self.start = clock.now()
        self.sequences = sequences
        self.actors = list(sequences)
        self.futures: dict[tuple, int] = {}  # canonical state -> orderings from it
        self.steps_played = 0
        self.stored: object = None  # the record the Datastore holds now (the run starts absent)
        # Every renaming of attempts that have the same steps (the clock keeps its name).
        groups = [
            [a for a in self.actors if a != CLOCK and sequences[a] == sequences[b]] for b in self.actors if b != CLOCK
        ]
        groups = [group for i, group in enumerate(groups) if group not in groups[:i]]
        self.renamings = [
            {
                actor: other
                for group, order in zip(groups, orders, strict=True)
                for actor, other in zip(group, order, strict=True)
            }
            for orders in itertools.product(*(itertools.permutations(group) for group in groups))
        ]

    def explore(self) -> int:
        """Check every ordering; return how many there were."""
        return self._visit(State(tuple(0 for _ in self.actors), None, (), Model(), ()))

    def _visit(self, state: State) -> int:
        key = self._canonical(state)
        if key in self.futures:
            return self.futures[key]
        enabled = [i for i, actor in enumerate(self.actors) if state.steps_taken[i] < len(self.sequences[actor])]
        if not enabled:
            self._restore(state)
            self._check_end(state)
            orderings = 1
        else:
            orderings = 0
            for index in enabled:
                self._restore(state)
                child, skipped = self._step(state, index)
                # A delivery that did not get the run is gone: its remaining
                # steps do nothing, wherever they fall among the others'.
                remaining = sum(len(self.sequences[a]) - n for a, n in zip(self.actors, child.steps_taken, strict=True))
                orderings += math.comb(remaining + skipped, skipped) * self._visit(child)
        self.futures[key] = orderings
        return orderings

    def _step(self, state: State, index: int) -> tuple[State, int]:
        """Play one step; return the state after it and how many steps of a gone delivery it skips."""
        actor = self.actors[index]
        step = self.sequences[actor][state.steps_taken[index]]
        taken = list(state.steps_taken)
        taken[index] += 1
        held, model, names = dict(state.held), state.model, dict(state.names)
        self.steps_played += actor != CLOCK
        where = (self.run_id, state.steps_taken, actor, step)
        skipped = 0
        wrote = False
        if actor == CLOCK:
            # Exactly one lease: a lease ends at the instant it names.
            self.clock.advance(LEASE)
            model = dataclasses.replace(model, now=model.now + LEASE)
        elif step == "claim":
            # As a delivery claims: the fast-path lookup, the claim's transaction begun beside it.
            outcome = self.ledger.replay_or_claim(self.run_id, DESCRIPTION, POLICY)
            if model.finished:
                assert isinstance(outcome, Replayed), (where, outcome)
            elif model.lease_is_live():
                assert isinstance(outcome, InProgress), (where, outcome)
            else:
                assert isinstance(outcome, Claimed), (where, outcome)
                assert outcome.attempt.number == model.attempts + 1, where  # the fencing counter rises
                assert outcome.attempt.downstream == model.downstream, where  # a takeover adopts
                held[actor] = outcome.attempt
                names[outcome.attempt.attempt_id] = actor
                model = dataclasses.replace(
                    model, owner=actor, lease_until=model.now + LEASE, attempts=model.attempts + 1
                )
                wrote = True
            if actor not in held:  # 409 or a replay: this delivery has gone away
                assert _dict(self._read()) == _dict(state.record), where  # a refused claim writes nothing
                skipped = len(self.sequences[actor]) - taken[index]
                taken[index] += skipped
        else:
            wrote = self._attempt_step(state, actor, step, held, model)
            model = self._model_after(model, actor, step)
        record = self._read() if wrote else state.record
        if wrote:
            self.stored = record
        next_state = State(tuple(taken), record, tuple(sorted(held.items())), model, tuple(sorted(names.items())))
        return next_state, skipped

    def _attempt_step(self, state: State, actor: str, step: str, held: dict, model: Model) -> bool:
        """A step of a delivery that got the run; return whether it changed the record."""
        attempt = held[actor]
        where = (self.run_id, state.steps_taken, actor, step)
        if step == "run":
            outcome = self.ledger.record_downstream(attempt, DOWNSTREAM.format(actor))
        elif step == "renew":
            outcome = self.ledger.renew_lease(attempt, LEASE)
        elif step == "complete":
            outcome = self.ledger.complete_run(attempt, {"by": actor}, POLICY)
        elif step == "fail":
            outcome = self.ledger.fail_run(attempt, {"by": actor}, POLICY)
        else:
            assert step == "release", step
            outcome = self.ledger.release_run(attempt, {"message": "transient"})
        if step in FINISHES:
            del held[actor]  # the attempt is gone, whatever the ledger said
        if model.owner != actor:  # taken over since its claim, or the run was finished by another
            assert isinstance(outcome, Stale), (where, outcome)
            assert _dict(self._read()) == _dict(state.record), where  # nothing changed
            return False
        expected = {"run": Renewed, "renew": Renewed, "release": Released}.get(step, Finished)
        assert isinstance(outcome, expected), (where, outcome)
        if step == "complete":
            assert (outcome.record.status, outcome.record.result) == (RunStatus.COMPLETED, {"by": actor}), where
        elif step == "fail":
            assert (outcome.record.status, outcome.record.error) == (RunStatus.FAILED, {"by": actor}), where
        elif step == "release":
            assert outcome.record.status == RunStatus.RELEASED and outcome.record.lease_expires <= self.clock.now()
        return True

    @staticmethod
    def _model_after(model: Model, actor: str, step: str) -> Model:
        """The model's view of an owner's step; a stale attempt changes nothing."""
        if model.owner != actor:
            return model
        if step == "run":
            return dataclasses.replace(model, downstream=DOWNSTREAM.format(actor))
        if step == "renew":
            return dataclasses.replace(model, lease_until=model.now + LEASE)
        if step == "release":
            # The record stays, released: the next claim continues its count and adopts its downstream.
            return dataclasses.replace(model, owner=None)
        return dataclasses.replace(model, owner=None, finished={"complete": "completed", "fail": "failed"}[step])

    def _check_end(self, state: State) -> None:
        """Every attempt is gone: one lease later the run is taken over, or replayed if it finished."""
        self.clock.advance(LEASE)
        self.steps_played += 1
        outcome = self.ledger.replay_or_claim(self.run_id, DESCRIPTION, POLICY)
        expected = Replayed if state.model.finished else Claimed
        assert isinstance(outcome, expected), (self.run_id, state.steps_taken, outcome)
        if state.model.finished:  # the replay answers with the one completion (or failure)
            assert outcome.record.status == state.model.finished, (self.run_id, state.steps_taken)
        self.stored = _CHANGED_BY_THE_END_CHECK

    def _read(self) -> RunRecord | None:
        found = self.ledger.store().lookup(self.run_id)
        return None if found is None else found.record

    def _restore(self, state: State) -> None:
        """Put the Datastore and the clock back as they were in ``state``."""
        self.clock.advance((self.start - self.clock.now()).total_seconds() + state.model.now)
        if self.stored is state.record:
            return  # the Datastore already holds it
        store = self.ledger.store()
        if isinstance(store, MemoryStore):
            if state.record is None:
                store.remove(ndb.Key(RunRecord, self.run_id))
            else:
                store.put(state.record)
        elif state.record is None:
            ndb.Key(RunRecord, self.run_id).delete()
        else:
            state.record.put()
        self.stored = state.record

    def _canonical(self, state: State) -> str:
        """The state with attempt ids (random) replaced by the names of their attempts.

        Attempts with the same steps are interchangeable: a state and the same
        state with such attempts' names swapped have the same futures, renamed,
        so the key is the least over those renamings.
        """
        return min(self._renamed(state, renaming) for renaming in self.renamings)

    def _renamed(self, state: State, renaming: dict[str, str]) -> str:
        def name(actor: str | None) -> str | None:
            return renaming.get(actor, actor)

        def started(downstream: str | None) -> str | None:
            return downstream and DOWNSTREAM.format(name(downstream.removeprefix(DOWNSTREAM.format(""))))

        names = {attempt_id: name(actor) for attempt_id, actor in state.names}
        record = _dict(state.record)
        if record is not None:
            record["attempt_id"] = names[record["attempt_id"]]
            record["attempts"] = [{**entry, "attempt_id": names[entry["attempt_id"]]} for entry in record["attempts"]]
            record["downstream"] = started(record["downstream"])
            for field in ("result", "error"):
                if isinstance(record[field], dict) and "by" in record[field]:
                    record[field] = {**record[field], "by": name(record[field]["by"])}
            record = sorted(record.items())
        taken = dict(zip(self.actors, state.steps_taken, strict=True))
        steps_taken = tuple(taken[actor] for actor in sorted(self.actors, key=lambda a: self.actors.index(name(a))))
        held = sorted((name(actor), attempt.number, started(attempt.downstream)) for actor, attempt in state.held)
        model = dataclasses.replace(
            state.model, owner=name(state.model.owner), downstream=started(state.model.downstream)
        )
        return repr((steps_taken, record, held, model))


def _dict(record: RunRecord | None) -> dict | None:
    return None if record is None else record.to_dict()


def orderings_of(sequences: dict[str, list[str]]) -> int:
    """How many merges keep each sequence's own order: the multinomial coefficient."""
    lengths = [len(steps) for steps in sequences.values()]
    return math.factorial(sum(lengths)) // math.prod(math.factorial(n) for n in lengths)


def explore_all(
    ndb_client,
    ledger_class: type[Ledger],
    prefix: str,
    attempts: int,
    options: list[list[str]],
    expiries: int,
    in_memory: bool = False,
) -> tuple[int, int]:
    """Explore every ordering for every choice of each attempt's steps among ``options``.

    Return (orderings, ledger steps played).  Attempts differ only in name, so
    a choice that is another one with the attempts renamed (A completes and B
    releases, or the other way round) has the same orderings renamed: one
    choice per multiset is explored and counted for all of its renamings.
    Each explored choice is its own run with its own clock, in a thread of its
    own: the time goes into Datastore round trips, which overlap.  ``in_memory``: the ledger's
    records in a MemoryStore of each choice's own (dedup/memory_store.py), ``ndb_client`` an
    offline one: the same decisions, at the speed of the process.
    """
    names = [chr(ord("A") + i) for i in range(attempts)]

    def explore(number: int, choice: tuple[int, ...]) -> tuple[int, int]:
        sequences = {**{name: options[i] for name, i in zip(names, choice, strict=True)}, CLOCK: ["expire"] * expiries}
        clock = ManualClock()
        with ndb_client.context():
            # No memory of completed runs: the explorer puts records back between orderings.
            memory = MemoryStore()
            store = {"store": lambda: memory} if in_memory else {}
            explorer = Explorer(ledger_class(clock, FinishedRuns(0), **store), clock, f"{prefix}-{number}", sequences)
            found = explorer.explore()
        assert found == orderings_of(sequences), sequences  # the graph stands for every ordering
        renamings = math.factorial(attempts) // math.prod(math.factorial(choice.count(i)) for i in set(choice))
        return found * renamings, explorer.steps_played

    choices = list(itertools.combinations_with_replacement(range(len(options)), attempts))
    with concurrent.futures.ThreadPoolExecutor(EXPLORER_THREADS) as pool:
        results = list(pool.map(explore, range(len(choices)), choices))
    return sum(found for found, _ in results), sum(played for _, played in results)


def finishing(*finishes: str) -> list[list[str]]:
    return [["claim", "run", "renew", finish] for finish in finishes]


@pytest.mark.timeout(900)
@pytest.mark.both_emulators  # three attempts: on the memory store, held to the same contract
def test_every_ordering_of_two_attempts(datastore, ndb_client):
    orderings, played = explore_all(ndb_client, Ledger, "two", 2, finishing("complete", "fail", "release"), expiries=2)
    assert orderings == 9 * math.factorial(10) // (4 * 3 * 2 * 4 * 3 * 2 * 2)  # 9 combinations x 3,150
    print(f"two attempts: {orderings:,} orderings checked with {played:,} ledger steps")


def offline_client() -> ndb.Client:
    """For the memory store: NDB builds keys in a context; this client never calls out."""
    from google.auth.credentials import AnonymousCredentials

    return ndb.Client(project="interleavings", credentials=AnonymousCredentials())


def test_every_ordering_of_two_attempts_on_the_memory_store():
    """The same exploration, the ledger's store in memory (tests/test_store_contract.py holds it
    to the Datastore store's contract): the decision layer alone, in seconds."""
    options = finishing("complete", "fail", "release")
    orderings, played = explore_all(offline_client(), Ledger, "two", 2, options, expiries=2, in_memory=True)
    assert orderings == 9 * math.factorial(10) // (4 * 3 * 2 * 4 * 3 * 2 * 2)


def test_every_ordering_of_three_attempts_on_the_memory_store():
    """Three attempts, each completing or releasing, racing each other (only one completion
    may land; failing is a fenced finish like completing, explored with two attempts above).
    On the memory store: tests/test_store_contract.py holds it to the Datastore store's
    contract on both emulators, and the two-attempt exploration above runs on both, so the
    emulators' run of this (a minute and a quarter) would prove nothing more."""
    options = finishing("complete", "release")
    orderings, played = explore_all(offline_client(), Ledger, "three", 3, options, expiries=2, in_memory=True)
    assert orderings == 8 * math.factorial(14) // (24 * 24 * 24 * 2)  # 8 combinations x 3,153,150
    print(f"three attempts: {orderings:,} orderings checked with {played:,} ledger steps")


def test_the_checker_catches_an_unfenced_completion_on_the_memory_store():
    """The memory store's exploration can fail too: a completion that skips the fence breaks it."""

    class Unfenced(Ledger):
        def complete_run(self, attempt, result, policy):
            store = self.store()
            record = store.lookup(attempt.run_id).record
            record.status, record.result = RunStatus.COMPLETED, result
            store.put(record)
            return Finished(record)

    with pytest.raises(AssertionError, match=r"Finished\("):
        explore_all(offline_client(), Unfenced, "unfenced", 2, [["claim", "complete"]], 1, in_memory=True)


def test_the_checker_catches_a_protocol_without_a_fence(datastore, ndb_client):
    """The checks can fail: a completion that skips the fence breaks them."""

    class Unfenced(Ledger):
        def complete_run(self, attempt, result, policy):
            record = RunRecord.get_by_id(attempt.run_id)
            record.status, record.result = RunStatus.COMPLETED, result
            record.put()
            return Finished(record)

    with pytest.raises(AssertionError, match=r"Finished\("):  # a stale completion went through
        explore_all(ndb_client, Unfenced, "unfenced", 2, [["claim", "complete"]], 1)


def test_the_checker_catches_a_claim_that_ignores_the_lease(datastore, ndb_client):
    """... and a claim that takes a run over while its lease is live."""

    class Impatient(Ledger):
        def replay_or_claim(self, run_id, description, policy, *args, **kwargs):
            outcome = super().replay_or_claim(run_id, description, policy, *args, **kwargs)
            if isinstance(outcome, InProgress):  # "it has been running for ages": take it anyway
                ndb.Key(RunRecord, run_id).delete()
                outcome = super().replay_or_claim(run_id, description, policy, *args, **kwargs)
            return outcome

    with pytest.raises(AssertionError, match=r"Claimed\("):  # a claim under a live lease went through
        explore_all(ndb_client, Impatient, "impatient", 2, [["claim", "complete"]], 0)


def test_the_checker_catches_a_renewal_without_a_fence(datastore, ndb_client):
    """... and a stale attempt that renews a lease it no longer holds."""

    class Unfenced(Ledger):
        def renew_lease(self, attempt, lease_seconds, patience_seconds=None):
            record = RunRecord.get_by_id(attempt.run_id)
            record.lease_expires = self.clock.now() + datetime.timedelta(seconds=lease_seconds)
            record.put()
            return Renewed(record)

    with pytest.raises(AssertionError, match=r"Renewed\("):  # a stale renewal went through
        explore_all(ndb_client, Unfenced, "renewal", 2, [["claim", "renew", "complete"]], 1)
