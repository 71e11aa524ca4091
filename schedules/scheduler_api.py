"""Cloud Scheduler's own pause and resume (``projects.locations.jobs.pause|resume``), beside the app's record.

Called with the app's credentials (Application Default Credentials, as the Google Cloud job
kinds call their APIs), at ``DEDUP_SCHEDULER_API_BASE`` (a local stand-in in tests; the real
service by default).  A failure is reported with the gcloud command that does the same by hand.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from dedup.errors import PermanentJobError, RetryableJobError
from jobs.base import http_url
from jobs.errors import JobsConfigError
from jobs.kinds.google_api import DEFAULT_TIMEOUT_SECONDS, GoogleApi
from schedules.config import SchedulerJob

DEFAULT_API_BASE = "https://cloudscheduler.googleapis.com"
BASE_SETTING = "DEDUP_SCHEDULER_API_BASE"


class SchedulerApiSettingError(ValueError):
    """DEDUP_SCHEDULER_API_BASE is not an http(s) base URL: the app refuses to start."""


def gcloud_command(job: SchedulerJob, action: str) -> str:
    """What an operator runs to do ``action`` (pause or resume) by hand."""
    return shlex.join(
        ["gcloud", "scheduler", "jobs", action, job.name, f"--location={job.location}", f"--project={job.project}"]
    )


class SchedulerApi:
    """The Cloud Scheduler API at a base URL."""

    def __init__(self, base_url: str = DEFAULT_API_BASE, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._api = GoogleApi(base_url, timeout_seconds)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SchedulerApi:
        base = environ.get(BASE_SETTING) or DEFAULT_API_BASE
        try:
            return cls(http_url("environment", BASE_SETTING, base, query=False))
        except JobsConfigError as exc:
            raise SchedulerApiSettingError(f"{BASE_SETTING}: {exc.reason}") from None

    def set_paused(self, job: SchedulerJob, paused: bool) -> str | None:
        """Pause or resume the Cloud Scheduler job; None when done (or so already), else why not.

        Scheduler pauses only an ENABLED job and resumes only a PAUSED one, so the job's
        state is read first: a request sent again finds its work done.
        """
        action = "pause" if paused else "resume"
        path = f"v1/projects/{job.project}/locations/{job.location}/jobs/{job.name}"
        try:
            state = self._api.call("GET", path).get("state")
            if state != ("PAUSED" if paused else "ENABLED"):
                self._api.call("POST", f"{path}:{action}", body={})
        except (PermanentJobError, RetryableJobError) as exc:
            return f"Cloud Scheduler did not {action} the job ({exc}); run: {gcloud_command(job, action)}"
        return None
