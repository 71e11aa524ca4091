"""The round trips one step adds to a run (issue 42): `python -m bench.steps`, and a section of `make bench`.

A run of a python job with no steps, three ``at_least_once`` steps and three ``at_most_once``
steps, through the real runner and ledger on the emulator, counted on the wire
(devtools/rpc_counter.py).  Each step record is the run's fenced write: where the fence was
verified at start-up, one update fenced on a version (``at_least_once`` records once, after the
call; ``at_most_once`` twice, before and after); where it was not, a transaction that reads
the record first.  A run's round trips are counted as the wire shows them (calls in flight
together count once); a step's are its RPCs, (a run with steps - a run without) / steps, which
on a loaded machine do not blur as two calls sent together and answered apart would: each step
record is one call or one transaction, never beside another.  Medians of the runs.
"""

from __future__ import annotations

import statistics
from typing import Any

from dedup import fence_check, fence_probe
from dedup.clock import SystemClock
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.runner import run_once
from devtools.rpc_counter import counting_client
from jobs.base import RunContext

STEPS = 3
POLICY = RunPolicy(lease_seconds=60, retention_seconds=3600)
DESCRIPTION = RunDescription(source="scheduler", job_id="bench-steps", scheduler_job_name="bench-steps")
CASES: dict[str, tuple[str, str | None] | None] = {
    "no steps": None,
    f"{STEPS} at_least_once steps": ("at_least_once", None),
    f"{STEPS} at_most_once steps": ("at_most_once", "review"),
}


def _job(case: tuple[str, str | None] | None) -> Any:
    def job(context: RunContext) -> Any:
        if case is None:
            return None
        semantic, on_unknown = case
        return [context.step(f"s{n}", lambda key: key, semantic=semantic, on_unknown=on_unknown) for n in range(STEPS)]

    return job


def measure(emulator: Any, runs: int = 20) -> dict[str, dict[str, dict[str, float]]]:
    """Per write path (``fenced``, ``transactional``) and case: the median run's round trips
    (``trips``) and RPCs (``rpcs``)."""
    client, counter = counting_client(emulator.project, emulator.host)
    verified = fence_probe.verify(client)
    database = fence_check.database_of(client)
    unverified = fence_check.FenceCheck(fence_check.FenceMode.TRANSACTION, "bench: as if unverified", True)
    figures: dict[str, dict[str, dict[str, float]]] = {}
    try:
        with client.context():
            ledger = Ledger(SystemClock())
            for path, check in (("fenced", verified), ("transactional", unverified)):
                fence_check.record(database, check)
                for label, case in CASES.items():
                    job, trips, rpcs = _job(case), [], []
                    for index in range(runs + 2):  # the first two warm the connection and the code
                        counter.wait_until_idle()
                        counter.reset()

                        def work(attempt: Any, job: Any = job) -> Any:
                            return job(RunContext.for_attempt(attempt, DESCRIPTION.job_id))

                        run_once(ledger, f"bench-steps-{path}-{label}-{index}", DESCRIPTION, POLICY, work)
                        counter.wait_until_idle()
                        if index >= 2:
                            trips.append(counter.sequential_round_trips())
                            rpcs.append(sum(counter.snapshot().values()))
                    figures.setdefault(path, {})[label] = {
                        "trips": statistics.median(trips),
                        "rpcs": statistics.median(rpcs),
                    }
    finally:
        fence_check.record(database, verified)
    return figures


def per_step(figures: dict[str, dict[str, float]], label: str) -> float:
    """The RPCs one step adds: each is a round trip of its own (see the module's docstring)."""
    return (figures[label]["rpcs"] - figures["no steps"]["rpcs"]) / STEPS


def section(figures: dict[str, dict[str, dict[str, float]]], runs: int) -> str:
    lines = [
        "\n## Round trips a step adds\n",
        f"A python job's run through the runner and the ledger (bench/steps.py), median of {runs} runs; "
        "a step's record is the run's fenced write.\n",
        "| write path | case | round trips per run | per step |",
        "|---|---|---:|---:|",
    ]
    for path, cases in figures.items():
        for label in CASES:
            added = "-" if label == "no steps" else f"{per_step(cases, label):g}"
            lines.append(f"| {path} | {label} | {cases[label]['trips']:g} | {added} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.steps [--runs N]``: this section alone, on an emulator of its own."""
    import argparse
    import logging
    import os

    from devtools.emulator import DatastoreEmulator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, choices=range(1, 201), metavar="N", help="runs per case")
    args = parser.parse_args(argv)
    quiet = logging.getLogger("dedup")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    saved = dict(os.environ)
    try:
        with DatastoreEmulator(project="dedup-bench") as emulator:
            os.environ.update(emulator.env)  # what ndb.Client reads; put back after, for whoever called this
            print(section(measure(emulator, args.runs), args.runs))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        quiet.setLevel(level)  # the caller's logging as it was
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
