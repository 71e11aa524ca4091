"""The job the benchmark runs: a trivial side effect, so the ledger's cost shows."""

from jobs import RunContext


def noop(context: RunContext) -> dict:
    return {"attempt": context.attempt}
