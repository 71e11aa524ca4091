"""Cloud Scheduler's own pause and resume (``projects.locations.jobs.pause|resume``), beside the app's record.

Called with the app's credentials (Application Default Credentials, as the Google Cloud job
kinds call their APIs), at ``DEDUP_SCHEDULER_API_BASE`` (a local stand-in in tests; the real
service by default).  A failure is reported with the gcloud command that does the same by hand.
"""

from __future__ import annotations

import shlex

from dedup.errors import PermanentJobError, RetryableJobError
from jobs.kinds.google_api import DEFAULT_TIMEOUT_SECONDS, GoogleApi
from schedules.config import SchedulerJob
from settings import DEFAULT_SCHEDULER_API_BASE


def gcloud_command(job: SchedulerJob, action: str) -> str:
    """What an operator runs to do ``action`` (pause or resume) by hand."""
    return shlex.join(
        ["gcloud", "scheduler", "jobs", action, job.name, f"--location={job.location}", f"--project={job.project}"]
    )


class SchedulerApi:
    """The Cloud Scheduler API at a base URL."""

    def __init__(
        self, base_url: str = DEFAULT_SCHEDULER_API_BASE, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        self._api = GoogleApi(base_url, timeout_seconds)

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
