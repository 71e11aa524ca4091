"""A ``python`` job: docs/jobs.md shows this file, and declares it as ``nightly-report``."""

from __future__ import annotations

from jobs import PermanentJobError, RunContext


def build_report(context: RunContext) -> dict:
    """One report per execution, however often Scheduler delivers it."""
    options = context.body_json() or dict(context.parameters)  # a delivery's body, or a manual run's
    rows = options.get("rows", 1200) if isinstance(options, dict) else None
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise PermanentJobError('the body must be {"rows": <a whole number>}', details={"got": options})
    return {"rows": rows, "report_key": context.downstream_key}  # pass the key on to whatever stores it
