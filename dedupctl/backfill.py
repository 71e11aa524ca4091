"""``python -m dedupctl backfill JOB``: run a job's missed, failed, released or skipped slots by hand.

Each slot runs under exactly the key Scheduler's own delivery of it has
(``POST /api/v1/jobs/JOB/executions/TIME/run``), with the retry rules of
``dedupctl run``, so a backfill and a late Scheduler retry are one run, and
running the same backfill again does nothing for the slots that completed.
Each request carries the attempt the listing showed, so a resend (a lost
answer, a timeout) is answered from the attempt it started, never run again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import urllib.parse
from typing import Any

import requests

from dedupctl.client import Exit, RetryPolicy, run_with_retries
from dedupctl.output import err, out, say

# schedules.slots.RUNNABLE and NEEDS_FORCE, spelled out: the client carries none of the app
# (tests/test_dedupctl.py holds the two equal).
REOPENABLE = ("missed", "paused", "excluded", "failed", "released", "skipped")
# An operator paused those slots, or set them aside as planned downtime, on purpose: a backfill
# runs them only when asked (--only paused, --only excluded).
DEFAULT_ONLY = ",".join(status for status in REOPENABLE if status not in ("paused", "excluded"))
# Past the job's retention the ledger may have forgotten a run, before a job's slots are expected
# (untracked) the app was not expecting it, and a stuck one's attempt may have taken effect: only
# --only unknown (untracked, stuck) --force runs one.
FORCED = ("unknown", "untracked", "stuck")
# The executions the app lists that a backfill leaves alone, and why.
LEFT_ALONE = {
    "completed": "completed already",
    "in_progress": "running now",
    "stuck": "an attempt started and never finished, so it may have taken effect (--only stuck --force runs it)",
    "due": "still inside its retry window: Scheduler may deliver it",
    "upcoming": "still to come",
    "unknown": "older than the job's retention, so it may have run (--only unknown --force runs it anyway)",
    "conflict": "another job's run holds its key: fix the routing (docs/schedules.md), then run it",
    "paused": "its Scheduler job was paused then (--only paused runs it)",
    "late": "completed, after its deadline",
    "overdue": "not completed by its deadline, and still to finish: Scheduler may deliver it",
    "untracked": "before the app first knew the schedule, so it may have run (--only untracked --force runs it)",
    "excluded": "planned downtime, in an exclusion window of its Scheduler job (--only excluded runs it)",
    "covered": "a compacted catch-up's run stands for it (compacted_into): it never runs on its own",
}


@dataclasses.dataclass(frozen=True)
class Backfill:
    """A backfill as asked on the command line (dedupctl/cli.py)."""

    url: str
    job: str
    since: str
    until: str
    only: str = DEFAULT_ONLY
    force: bool = False
    dry_run: bool = False
    concurrency: int = 1
    max_attempts: int = RetryPolicy.max_attempts
    deadline: float = RetryPolicy.deadline_seconds
    backoff: float = RetryPolicy.backoff_base_seconds
    request_timeout: float = RetryPolicy.timeout_seconds


def backfill(args: Backfill, headers: dict[str, str]) -> int:
    only = [status.strip() for status in args.only.split(",") if status.strip()]
    if not only or set(only) - set(REOPENABLE + FORCED):
        say(f"--only takes some of {','.join(REOPENABLE + FORCED)}")
        return Exit.REFUSED
    if set(only) & set(FORCED) and not args.force:
        say(
            "unknown slots are older than the job's retention, untracked ones before the app first knew the "
            "schedule, and stuck ones started an attempt that never finished: each may have run, so running them "
            "may run the job twice. Add --force to run them anyway"
        )
        return Exit.REFUSED
    if (
        not 1 <= args.concurrency <= 16
        or args.max_attempts < 1
        or not args.deadline > 0
        or not args.request_timeout > 0
    ):
        say("--concurrency 1 to 16, --max-attempts, --deadline and --request-timeout above 0")
        return Exit.REFUSED
    base = f"{args.url.rstrip('/')}/api/v1/jobs/{urllib.parse.quote(args.job, safe='')}/executions"
    try:
        executions = _executions(base, args.since, args.until, headers)
    except _Refused as refused:
        err(refused.answer)
        return refused.exit
    chosen = [e for e in executions if e["status"] in only]
    for execution in executions:
        if execution not in chosen:
            why = LEFT_ALONE.get(execution["status"], f"{execution['status']}, not asked for (--only)")
            say(f"{execution['schedule_time']} {execution['scheduler_job']}: left alone, {why}")
    if args.dry_run or not chosen:
        for execution in chosen:
            out(json.dumps({"schedule_time": execution["schedule_time"], "status": execution["status"], "ran": False}))
        say(f"{len(chosen)} slot(s) to run" + (" (dry run: nothing ran)" if args.dry_run else ""))
        return Exit.OK
    policy = RetryPolicy(args.max_attempts, args.deadline, args.backoff, timeout_seconds=args.request_timeout)
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        outcomes = list(pool.map(lambda e: _run_slot(base, e, headers, policy), chosen))
    for execution, (_, answer) in zip(chosen, outcomes, strict=True):
        out(json.dumps({"schedule_time": execution["schedule_time"], "was": execution["status"], "answer": answer}))
    worst = max((code for code, _ in outcomes), default=Exit.OK)
    say(f"ran {len(chosen)} slot(s); exit {int(worst)}")
    return worst


class _Refused(Exception):
    def __init__(self, exit_code: Exit, answer: str) -> None:
        super().__init__(answer)
        self.exit, self.answer = exit_code, answer


def _executions(base: str, since: str, until: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every expected execution in [since, until), following next_since across pages."""
    found: list[dict[str, Any]] = []
    cursor: str | None = since
    while cursor is not None:
        try:
            response = requests.get(
                base,
                params={"since": cursor, "until": until},
                headers=headers,
                timeout=RetryPolicy.timeout_seconds,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise _Refused(Exit.GAVE_UP, f"dedupctl: {base}: {exc}") from None
        if response.status_code != 200:
            code = Exit.GAVE_UP if response.status_code >= 500 else Exit.REFUSED
            raise _Refused(code, response.text.rstrip())
        page = response.json()
        found += page["executions"]
        cursor = page.get("next_since")
    return found


def _run_slot(base: str, execution: dict[str, Any], headers: dict[str, str], policy: RetryPolicy) -> tuple[Exit, Any]:
    """One slot's run, carrying the attempt the listing showed: every resend of it is one reopen."""
    fields = {name: execution[name] for name in ("scheduler_job", "project", "location")}
    fields["attempt"] = (execution.get("run") or {}).get("attempt", 0)
    if execution["status"] in FORCED:
        fields["force"] = "true"
    query = urllib.parse.urlencode(fields)
    url = f"{base}/{urllib.parse.quote(execution['schedule_time'], safe='')}/run?{query}"
    session = requests.Session()

    def send(timeout: float) -> requests.Response:
        return session.post(url, headers=headers, timeout=timeout, allow_redirects=False)

    try:
        outcome = run_with_retries(send, policy)
    except requests.RequestException as exc:
        return Exit.REFUSED, str(exc)
    return outcome.exit, outcome.body
