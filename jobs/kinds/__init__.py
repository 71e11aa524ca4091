"""The registry of job kinds.  A new kind is a module with a JobKind subclass, added here."""

from __future__ import annotations

from jobs.base import JobKind
from jobs.kinds.cloud_build_trigger import CloudBuildTriggerJob
from jobs.kinds.cloud_run_job import CloudRunJob
from jobs.kinds.external import ExternalJob
from jobs.kinds.http import HttpJob
from jobs.kinds.python import PythonJob
from jobs.kinds.workflow import WorkflowJob

KINDS: dict[str, type[JobKind]] = {}


def register_kind(kind: type[JobKind]) -> type[JobKind]:
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"job kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


for _kind in (PythonJob, HttpJob, WorkflowJob, CloudRunJob, CloudBuildTriggerJob, ExternalJob):
    register_kind(_kind)
