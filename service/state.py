"""The app's state: what every service call reads (jobs, clock, ledger, schedules, queue).

Built once by ``create_app`` and passed to each service function as a parameter, so the
service never reaches into a request or an app object to find it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping

from google.cloud import ndb

from dedup.clock import Clock, SystemClock
from dedup.ledger import Ledger
from dedup.runner import WaitSlots
from dispatch import Dispatcher
from dispatch.in_process import InProcessDispatcher
from jobs.config import JobSpec
from schedules.bound import BoundJob
from schedules.config import SchedulerJob
from schedules.history import TrackedSchedules
from schedules.scheduler_api import SchedulerApi
from service.window import DEFAULT_NIGHT, Night

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AppState:
    """Built once by ``create_app``; the same for every request."""

    jobs: Mapping[str, JobSpec]
    clock: Clock
    ledger: Ledger  # the one ledger: scheduled runs, manual runs and guarded views share it
    wait_slots: WaitSlots  # the bound on this process's requests waiting at once (Prefer: wait)
    # scheduler.yaml's jobs, validated against ``jobs``, and what the app learned of them (bound on first use).
    tracked_schedules: TrackedSchedules = dataclasses.field(default_factory=lambda: TrackedSchedules((), SystemClock()))

    # Cloud Scheduler's own pause and resume (DEDUP_SCHEDULER_API_BASE).
    scheduler_api: SchedulerApi = dataclasses.field(default_factory=SchedulerApi)

    # Where work is dispatched to be done in a request of its own (dispatch: Cloud Tasks, or in-process).
    dispatcher: Dispatcher = dataclasses.field(default_factory=InProcessDispatcher)

    # The Google Cloud project (GOOGLE_CLOUD_PROJECT, as start-up read it): where log links point.
    project: str | None = None

    # The operators' night (DEDUP_NIGHT): what the dashboard's "last night" window is.
    night: Night = dataclasses.field(default_factory=lambda: Night.parse(DEFAULT_NIGHT))

    @property
    def schedules(self) -> tuple[SchedulerJob, ...]:
        """The Scheduler jobs as scheduler.yaml declares them: what the file says, nothing learned."""
        return self.tracked_schedules.declared

    @property
    def bound_schedules(self) -> tuple[BoundJob, ...]:
        """The Scheduler jobs bound to their histories and retention, pauses unread (the first use in
        a process records the histories: needs NDB)."""
        return self.tracked_schedules.get()

    def bind_schedules(self, client: Callable[[], ndb.Client]) -> bool:
        """Bind the schedules now, in a context of ``client()`` (a worker about to serve): True when
        bound.  A worker binds them before its first request, so no delivery waits for a fleet's;
        if Datastore cannot be reached then (or no client can be made: no credentials, no
        project), the worker starts all the same and the first request that needs them binds them."""
        try:
            with client().context():
                self.tracked_schedules.get()
        except Exception as exc:  # the first request tries again: a worker must start regardless
            log.warning("the schedules were not bound before serving (%r); the first request binds them", exc)
            return False
        return True

    def with_pauses(self, jobs: Iterable[SchedulerJob] | None = None) -> list[BoundJob]:
        """The declared Scheduler jobs (or ``jobs`` of them) bound to all the app learned, their
        pauses read now (needs NDB)."""
        return self.tracked_schedules.bound(self.schedules if jobs is None else jobs)
