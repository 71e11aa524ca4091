"""What every request reads: the app's state (jobs, clock, ledger, schedules) and who is asking.

Its own module, so that blueprints and use cases read them without importing the app
factory (``handlers/__init__.py``), which imports the blueprints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

from flask import current_app, g

from dedup.clock import Clock, SystemClock
from dedup.ledger import Ledger
from dedup.runner import WaitSlots
from dispatch import Dispatcher
from dispatch.in_process import InProcessDispatcher
from handlers.access import Principal, Role
from jobs.config import JobSpec
from schedules.config import SchedulerJob
from schedules.history import TrackedSchedules
from schedules.scheduler_api import SchedulerApi


@dataclasses.dataclass(frozen=True)
class AppState:
    """Built once by ``create_app``; the same for every request."""

    jobs: Mapping[str, JobSpec]
    clock: Clock
    ledger: Ledger  # the one ledger: scheduled runs, manual runs and guarded views share it
    wait_slots: WaitSlots  # the bound on this process's requests waiting at once (Prefer: wait)
    # scheduler.yaml's jobs, validated against ``jobs``, bound to their histories on first use.
    tracked_schedules: TrackedSchedules = dataclasses.field(default_factory=lambda: TrackedSchedules((), SystemClock()))

    # Cloud Scheduler's own pause and resume (DEDUP_SCHEDULER_API_BASE).
    scheduler_api: SchedulerApi = dataclasses.field(default_factory=SchedulerApi)

    # Where work is dispatched to be done in a request of its own (dispatch: Cloud Tasks, or in-process).
    dispatcher: Dispatcher = dataclasses.field(default_factory=InProcessDispatcher)

    # The Google Cloud project (GOOGLE_CLOUD_PROJECT, as start-up read it): where log links point.
    project: str | None = None

    @property
    def schedules(self) -> tuple[SchedulerJob, ...]:
        """The Scheduler jobs bound to their histories (the first use in a process records them: needs NDB)."""
        return self.tracked_schedules.get()


def app_state() -> AppState:
    return cast(AppState, current_app.extensions["dedup"])


def current_principal() -> Principal:
    """Who the gate admitted this request as (every view runs after it)."""
    return cast(Principal, g.principal)


def may(role: Role) -> bool:
    """Whether this request's principal has ``role`` (what a page offers, e.g. buttons for operators)."""
    return role in g.get("roles", frozenset())
