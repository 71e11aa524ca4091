"""`python -m deploy alerts`' policies, parsed by Google's own client (issue 40's table).

google-cloud-monitoring's ``AlertPolicy`` is the message Cloud Monitoring's API takes: each
policy the command prints must parse as one, with no field it does not know, so a policy that
gcloud would send is one the API accepts in shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from google.cloud import monitoring_v3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def printed_policies() -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-m", "deploy", "alerts", "--project", "acme-prod", "--notification-channel", "123"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return [part.split("\nEOF", 1)[0] for part in completed.stdout.split("<<'EOF'\n")[1:]]


def test_each_policy_parses_as_cloud_monitorings_alert_policy():
    policies = printed_policies()
    assert len(policies) == 2
    for text in policies:
        policy = monitoring_v3.AlertPolicy.from_json(text, ignore_unknown_fields=False)
        assert policy.display_name and policy.conditions
        assert list(policy.notification_channels) == ["projects/acme-prod/notificationChannels/123"]
        # What was printed is what parsed: every condition, by its name.
        printed = json.loads(text)
        assert [c.display_name for c in policy.conditions] == [c["displayName"] for c in printed["conditions"]]
        assert policy.combiner.name == printed["combiner"]
