"""``python -m deploy dashboard`` and ``alerts``: Cloud Monitoring's dashboard and alert policies
over the metrics the app writes (schedules/metrics.py, dedup/metrics.py), from scheduler.yaml.

The dashboard: a fleet summary on top (every slot's outcome, takeovers and stale attempts, the
409s, the claims' round trips), then one row per Scheduler job (its outcomes over time, schedule
delay, run duration, attempts), JOBS_PER_DASHBOARD rows a dashboard.  The policies count slots,
never attempts (a slot's outcome is counted once, when it is decided), each grouped by the
Scheduler job and the job, so an incident names both in its labels and its documentation:

- forward progress: no slot of a job ran (once or after more attempts) for one period plus its
  ``finish_within``, or FORWARD_PROGRESS_PERIODS periods when it has none (a metric absence; for
  a job slower than an absence can wait, a threshold on the audit's ``dedup.slot.progress_age``,
  whose absence says the audit has stopped).  A
  slot of an exclusion window counts as progress (planned downtime pages no one): the audit
  counts it ``excluded`` once it has judged it, so a job with windows waits that long more;
- a slot missed, stuck, failed for good, or held by another job's run (a conflict): each counted
  as it is decided.

A paused job makes no progress, and pages once paused for longer than its wait: the reminder of
a pause left on.

A slot that failed an attempt and completed on a retry is counted ``ran_after_retries`` and
nothing else, so it raises nothing.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from dedup.metrics import CONFLICTS_NAME, ROUND_TRIPS_NAME, STALE_NAME, TAKEOVERS_NAME
from schedules.config import SchedulerJob, audit_lag_seconds, schedule_period_seconds
from schedules.metrics import (
    ATTEMPTS_NAME,
    DELAY_NAME,
    DURATION_NAME,
    OUTCOMES_NAME,
    PROGRESS_AGE_NAME,
    Outcome,
    metric_type,
)

# A row a job, four charts a row, twelve columns each of the mosaic's 48: a dashboard of 24 jobs
# holds 100 charts, the summary's four with them; a larger fleet gets a dashboard per 24 jobs.
JOBS_PER_DASHBOARD = 24
COLUMNS, WIDTH, HEIGHT = 48, 12, 4
# Forward progress without a finish_within: this many periods with no slot run.
FORWARD_PROGRESS_PERIODS = 2
# Cloud Monitoring's bounds on a metric absence's duration (whole minutes, 2 minutes to 23.5
# hours: docs.cloud.google.com/monitoring/alerts/metric-absence), and on a policy's conditions.
ABSENCE_MIN_SECONDS, ABSENCE_MAX_SECONDS = 120, 84_600
CONDITIONS_PER_POLICY = 6
JOBS_PER_CONDITION = 20  # a filter naming 20 Scheduler jobs stays a few hundred characters
# A slot counted missed, stuck or failed is counted over this long: an incident per job, not per slot.
ALIGNMENT = "300s"
# What forward progress is: a slot that ran, or one an exclusion window said not to run.
PROGRESS = (Outcome.RAN_ONCE, Outcome.RAN_AFTER_RETRIES, Outcome.EXCLUDED)


def _filter(name: str, *clauses: str) -> str:
    return " AND ".join([f'metric.type="{metric_type(name)}"', *clauses])


def _one_of(label: str, values: Iterable[str]) -> str:
    return f"metric.label.{label}=one_of({', '.join(json.dumps(str(v)) for v in values)})"


def _of_job(job: SchedulerJob) -> str:
    return f'metric.label.scheduler_job="{job.name}"'


def _counts(filter_: str, group_by: Sequence[str], plot: str = "LINE", legend: str | None = None) -> dict[str, Any]:
    """A counter's data set: its increase a minute, summed by ``group_by`` (over every process's series)."""
    aggregation = {
        "alignmentPeriod": "60s",
        "perSeriesAligner": "ALIGN_DELTA",
        "crossSeriesReducer": "REDUCE_SUM",
        "groupByFields": list(group_by),
    }
    data_set: dict[str, Any] = {
        "timeSeriesQuery": {"timeSeriesFilter": {"filter": filter_, "aggregation": aggregation}},
        "plotType": plot,
    }
    if legend is not None:
        data_set["legendTemplate"] = legend
    return data_set


def _chart(title: str, *data_sets: dict[str, Any]) -> dict[str, Any]:
    return {"title": title, "xyChart": {"dataSets": list(data_sets)}}


def _percentiles(title: str, name: str, job: SchedulerJob) -> dict[str, Any]:
    """A distribution's median and 99th percentile over a job's series."""
    data_sets = [
        {
            "timeSeriesQuery": {
                "timeSeriesFilter": {
                    "filter": _filter(name, _of_job(job)),
                    "aggregation": {
                        "alignmentPeriod": "60s",
                        "perSeriesAligner": "ALIGN_DELTA",
                        "crossSeriesReducer": reducer,
                        "groupByFields": ["metric.label.scheduler_job"],
                    },
                }
            },
            "plotType": "LINE",
            "legendTemplate": legend,
        }
        for reducer, legend in (("REDUCE_PERCENTILE_50", "p50"), ("REDUCE_PERCENTILE_99", "p99"))
    ]
    return {"title": title, "xyChart": {"dataSets": data_sets}}


def _summary() -> list[dict[str, Any]]:
    job = ["metric.label.job"]
    return [
        _chart("Every slot, by outcome", _counts(_filter(OUTCOMES_NAME), ["metric.label.outcome"], "STACKED_BAR")),
        _chart(
            "Takeovers and stale attempts, by job",
            _counts(_filter(TAKEOVERS_NAME), job, legend="takeovers: ${metric.label.job}"),
            _counts(_filter(STALE_NAME), job, legend="stale: ${metric.label.job}"),
        ),
        _chart("409s answered, by job", _counts(_filter(CONFLICTS_NAME), job)),
        _chart("Claims' Datastore round trips, by job", _counts(_filter(ROUND_TRIPS_NAME), job)),
    ]


def _row(job: SchedulerJob) -> list[dict[str, Any]]:
    title = f"{job.name} → {job.target}"
    return [
        _chart(
            f"{title}: outcomes", _counts(_filter(OUTCOMES_NAME, _of_job(job)), ["metric.label.outcome"], "STACKED_BAR")
        ),
        _percentiles(f"{title}: schedule delay (s)", DELAY_NAME, job),
        _percentiles(f"{title}: run duration (s)", DURATION_NAME, job),
        _percentiles(f"{title}: attempts", ATTEMPTS_NAME, job),
    ]


def dashboards(jobs: Sequence[SchedulerJob]) -> list[dict[str, Any]]:
    """The dashboards of ``jobs``: the fleet's summary and a row a job, JOBS_PER_DASHBOARD rows each."""
    chunks = [list(jobs[i : i + JOBS_PER_DASHBOARD]) for i in range(0, len(jobs), JOBS_PER_DASHBOARD)] or [[]]
    found = []
    for number, chunk in enumerate(chunks, 1):
        rows = [_summary(), *(_row(job) for job in chunk)]
        tiles = [
            {"xPos": column * WIDTH, "yPos": line * HEIGHT, "width": WIDTH, "height": HEIGHT, "widget": widget}
            for line, row in enumerate(rows)
            for column, widget in enumerate(row)
        ]
        name = "Dedup: Scheduler jobs" + (f" ({number} of {len(chunks)})" if len(chunks) > 1 else "")
        found.append({"displayName": name, "mosaicLayout": {"columns": COLUMNS, "tiles": tiles}})
    return found


def _wait_seconds(job: SchedulerJob, periods: int) -> float:
    """How long without a slot run means no forward progress: one period plus finish_within, or ``periods`` periods."""
    period = schedule_period_seconds(job.schedule, job.time_zone)
    return period + job.finish_within if job.finish_within is not None else periods * period


def _whole_minutes(seconds: float) -> int:
    return max(ABSENCE_MIN_SECONDS, -(-int(seconds) // 60) * 60)  # up to a whole minute, at least 2


def forward_progress_seconds(job: SchedulerJob, periods: int = FORWARD_PROGRESS_PERIODS) -> int | None:
    """How long a metric absence of the job's ran slots waits: ``_wait_seconds``, in whole minutes,
    at least 2; None past what a metric absence can wait (then ``progress_age_threshold`` watches).

    A job with exclusion windows waits as long again as the audit takes to judge a slot: a window's
    slots are counted (as progress) by the audit, not when they fall due."""
    seconds = _wait_seconds(job, periods) + (audit_lag_seconds(job) if job.exclude else 0)
    wait = _whole_minutes(seconds)
    return wait if wait <= ABSENCE_MAX_SECONDS else None


def progress_age_threshold(job: SchedulerJob, periods: int = FORWARD_PROGRESS_PERIODS) -> int:
    """The ``dedup.slot.progress_age`` past which a slow job (a wait past a metric absence's) has
    made no forward progress: its wait, and the time the audit takes to judge a slot (the age
    counts from the newest slot the audit has judged to have made progress)."""
    return _whole_minutes(_wait_seconds(job, periods) + audit_lag_seconds(job))


# The audit writes every job's progress age each pass (cron.yaml: every 15 minutes): none for
# this long says it has stopped, and with it every alert that counts on its judging.
AUDIT_SILENCE_SECONDS = 3600
# A slow job's progress age is read over this long, its least value: whichever pass wrote it.
AGE_ALIGNMENT = "3600s"


def _documentation(subject: str, what: str) -> dict[str, str]:
    return {
        "subject": f"Dedup: {subject} (${{metric.label.scheduler_job}} → ${{metric.label.job}})",
        "content": (
            f"Scheduler job ${{metric.label.scheduler_job}} (job ${{metric.label.job}}): {what} "
            "Its slots are on the operator's page (/admin/), in the job's history."
        ),
        "mimeType": "text/markdown",
    }


_GROUPED = {"crossSeriesReducer": "REDUCE_SUM", "groupByFields": ["metric.label.scheduler_job", "metric.label.job"]}


def _counted(outcome: Outcome, what: str) -> dict[str, Any]:
    return {
        "displayName": f"A slot {what}",
        "conditionThreshold": {
            "filter": _filter(OUTCOMES_NAME, f'metric.label.outcome="{outcome}"'),
            "aggregations": [{"alignmentPeriod": ALIGNMENT, "perSeriesAligner": "ALIGN_DELTA", **_GROUPED}],
            "comparison": "COMPARISON_GT",
            "thresholdValue": 0,
            "duration": "0s",
            "trigger": {"count": 1},
        },
    }


def channel_names(project: str, channels: Sequence[str]) -> list[str]:
    return [c if c.startswith("projects/") else f"projects/{project}/notificationChannels/{c}" for c in channels]


def slot_policy(project: str, channels: Sequence[str]) -> dict[str, Any]:
    """A slot missed, stuck or failed for good: each counted once, when decided."""
    return {
        "displayName": "Dedup: a slot missed, stuck, failed or in conflict",
        "combiner": "OR",
        "conditions": [
            _counted(Outcome.MISSED, "was missed: no run, and no retry can come"),
            _counted(Outcome.STUCK, "is stuck: its attempt started and never finished"),
            _counted(Outcome.FAILED, "failed for good (a retry that succeeded raises nothing)"),
            _counted(Outcome.CONFLICT, "is held by another job's run: the Scheduler job's target changed"),
        ],
        "documentation": _documentation(
            "a slot missed, stuck, failed or held by another job",
            "a slot was missed, is stuck, failed for good, or is held by another job's run in the last 5 minutes.",
        ),
        "userLabels": {"app": "dedup"},
        "notificationChannels": channel_names(project, channels),
    }


def progress_policies(
    project: str, channels: Sequence[str], jobs: Sequence[SchedulerJob], periods: int = FORWARD_PROGRESS_PERIODS
) -> list[dict[str, Any]]:
    """The forward-progress policies: a condition per wait and JOBS_PER_CONDITION jobs, six to a
    policy; a metric absence of ran slots, or for a wait past what an absence allows, a threshold
    on the audit's progress age.  The first policy also says when the audit stops."""
    by_wait: dict[int, list[SchedulerJob]] = {}
    by_age: dict[int, list[SchedulerJob]] = {}
    for job in jobs:
        wait = forward_progress_seconds(job, periods)
        if wait is None:
            by_age.setdefault(progress_age_threshold(job, periods), []).append(job)
        else:
            by_wait.setdefault(wait, []).append(job)
    conditions: list[dict[str, Any]] = [
        {
            "displayName": f"The audit has not judged any slot for {AUDIT_SILENCE_SECONDS // 60} minutes",
            "conditionAbsent": {
                "filter": _filter(PROGRESS_AGE_NAME),
                "aggregations": [
                    {"alignmentPeriod": "300s", "perSeriesAligner": "ALIGN_MAX", "crossSeriesReducer": "REDUCE_MAX"}
                ],
                "duration": f"{AUDIT_SILENCE_SECONDS}s",
                "trigger": {"count": 1},
            },
        }
    ]
    for wait, waiting in sorted(by_wait.items()):
        for first in range(0, len(waiting), JOBS_PER_CONDITION):
            named = sorted({job.name for job in waiting[first : first + JOBS_PER_CONDITION]})
            ran = _filter(OUTCOMES_NAME, _one_of("outcome", PROGRESS), _one_of("scheduler_job", named))
            conditions.append(
                {
                    "displayName": f"No slot ran for {wait // 60} minutes ({len(named)} Scheduler jobs)",
                    "conditionAbsent": {
                        "filter": ran,
                        "aggregations": [{"alignmentPeriod": "60s", "perSeriesAligner": "ALIGN_DELTA", **_GROUPED}],
                        "duration": f"{wait}s",
                        "trigger": {"count": 1},
                    },
                }
            )
    for threshold, waiting in sorted(by_age.items()):
        for first in range(0, len(waiting), JOBS_PER_CONDITION):
            named = sorted({job.name for job in waiting[first : first + JOBS_PER_CONDITION]})
            conditions.append(
                {
                    "displayName": f"No slot ran for {threshold / 3600:.1f} hours ({len(named)} Scheduler jobs)",
                    "conditionThreshold": {
                        "filter": _filter(PROGRESS_AGE_NAME, _one_of("scheduler_job", named)),
                        "aggregations": [
                            {
                                "alignmentPeriod": AGE_ALIGNMENT,
                                "perSeriesAligner": "ALIGN_MIN",
                                "crossSeriesReducer": "REDUCE_MIN",
                                "groupByFields": _GROUPED["groupByFields"],
                            }
                        ],
                        "comparison": "COMPARISON_GT",
                        "thresholdValue": threshold,
                        "duration": "0s",
                        "trigger": {"count": 1},
                    },
                }
            )
    policies = []
    batches = [conditions[i : i + CONDITIONS_PER_POLICY] for i in range(0, len(conditions), CONDITIONS_PER_POLICY)]
    for number, batch in enumerate(batches, 1):
        policies.append(
            {
                "displayName": "Dedup: no forward progress"
                + (f" ({number} of {len(batches)})" if len(batches) > 1 else ""),
                "combiner": "OR",
                "conditions": batch,
                "documentation": _documentation(
                    "no forward progress",
                    "no slot has run (once, or after more attempts) for longer than one period and its "
                    "finish_within (or than two periods): its deliveries are not arriving, or every run fails. "
                    "A paused job raises this too once paused for that long: resume it, or close the incident. "
                    "Slots of its exclusion windows count as progress. The audit's silence for an hour raises it "
                    "too: no slot is being judged, so no missed slot can alert (check /tasks/audit and cron.yaml).",
                ),
                "userLabels": {"app": "dedup"},
                "notificationChannels": channel_names(project, channels),
            }
        )
    return policies


def file_names(prefix: str, count: int) -> list[str]:
    """``prefix.json``, or ``prefix-1.json`` ... when there are several."""
    if count == 1:
        return [f"{prefix}.json"]
    return [f"{prefix}-{number}.json" for number in itertools.islice(itertools.count(1), count)]
