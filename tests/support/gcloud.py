"""gcloud's own parser as a check: a command runs with a configuration of its own, its project
set (as a reader's is) and no account, so one gcloud parses stops at its first call to Google,
and one it cannot parse exits with 2 naming the argument."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

# What a reader fills in: the docs' shell variables and placeholders.
FILLED_IN = {
    "$SA": "dedup-app@acme-prod.iam.gserviceaccount.com",
    "TRIGGER_SA_EMAIL": "builds@acme-prod.iam.gserviceaccount.com",
    "PROJECT_ID": "acme-prod",
    "PROJECT_NUMBER": "123456789012",
    "REGION": "us-central1",
}
PARSED = "You do not currently have an active account selected"
PARSED = "You do not currently have an active account selected"


def parse(command: str, folder: Path) -> tuple[int, str]:
    if shutil.which("gcloud") is None:
        pytest.fail("gcloud is not on PATH: install the Google Cloud CLI (README, Needs)")
    for name, value in FILLED_IN.items():
        command = command.replace(name, value)
    arguments = [word for word in shlex.split(command, comments=True) if word != "&"]
    environ = {**os.environ, "CLOUDSDK_CONFIG": str(folder / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    environ["CLOUDSDK_CORE_PROJECT"] = "acme-prod"
    environ.pop("CLOUDSDK_CORE_ACCOUNT", None)
    done = subprocess.run(
        arguments, cwd=folder, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stderr
