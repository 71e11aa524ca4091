"""Jobs for trying the app locally with `make run`."""

from __future__ import annotations

import time

from jobs import PermanentJobError, RunContext


def slow_report(context: RunContext) -> dict:
    """Take a while (``{"seconds": N}`` in the body, default 15) so duplicates meet a live lease."""
    options = context.body_json() or {}
    seconds = options.get("seconds", 15) if isinstance(options, dict) else 15
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 300:
        raise PermanentJobError(f"'seconds' must be a number from 0 to 300, got {seconds!r}")
    time.sleep(seconds)
    return {"report": "done", "slept_seconds": seconds, "attempt": context.attempt}
