"""`python -m deploy alerts`' policies, parsed by Google's own client (issue 40's table, issue 41 §2).

google-cloud-monitoring's ``AlertPolicy`` is the message Cloud Monitoring's API takes: each
policy the command prints must parse as one, with no field it does not know, so a policy that
gcloud would send is one the API accepts in shape.  The metric policies count slots, grouped by
Scheduler job and job, so an incident names both; a retry that succeeded counts no failure
(tests/test_metrics.py), so it raises nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from google.cloud import monitoring_v3

from tests.support.shipped import EXAMPLE_SCHEDULE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = str(EXAMPLE_SCHEDULE)  # the shipped example, as tests.support.shipped names it


def printed_policies() -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-m", "deploy", "alerts", FIXTURE, "--project", "acme-prod", "--notification-channel", "123"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return [part.split("\nEOF", 1)[0] for part in completed.stdout.split("<<'EOF'\n")[1:]]


def test_each_policy_parses_as_cloud_monitorings_alert_policy():
    policies = printed_policies()
    assert len(policies) == 3  # slots missed, stuck or failed; forward progress; the audit's breaches
    for text in policies:
        policy = monitoring_v3.AlertPolicy.from_json(text, ignore_unknown_fields=False)
        assert policy.display_name and policy.conditions
        assert list(policy.notification_channels) == ["projects/acme-prod/notificationChannels/123"]
        # What was printed is what parsed: every condition, by its name.
        printed = json.loads(text)
        assert [c.display_name for c in policy.conditions] == [c["displayName"] for c in printed["conditions"]]
        assert policy.combiner.name == printed["combiner"]
        assert "scheduler_job" in policy.documentation.content and policy.documentation.subject
    slots, progress, _ = [monitoring_v3.AlertPolicy.from_json(text) for text in policies]
    for condition in slots.conditions:
        (aggregation,) = condition.condition_threshold.aggregations
        assert list(aggregation.group_by_fields) == ["metric.label.scheduler_job", "metric.label.job"]
        assert aggregation.per_series_aligner.name == "ALIGN_DELTA"
    silence, waiting, aged = progress.conditions  # the audit's silence; sync-crm-hourly; the daily job
    assert silence.condition_absent.duration.seconds == 3600
    assert waiting.condition_absent.duration.seconds == 2 * 3600
    assert '"sync-crm-hourly"' in waiting.condition_absent.filter
    assert (
        aged.condition_threshold.comparison.name == "COMPARISON_GT" and aged.condition_threshold.threshold_value > 86400
    )
