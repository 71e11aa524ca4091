"""The job the benchmark runs: a trivial side effect, so the ledger's cost shows."""

from jobs import RunContext


def noop(context: RunContext) -> dict:
    return {"attempt": context.attempt}


def half_second(context: RunContext) -> dict:
    """A job slow enough that concurrent duplicates meet its live lease."""
    import time

    time.sleep(0.5)
    return {"attempt": context.attempt}
