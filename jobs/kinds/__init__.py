"""The registry of job kinds.  A new kind is a module with a JobKind subclass, added here."""

from __future__ import annotations

from jobs.base import JobKind
from jobs.kinds.http import HttpJob
from jobs.kinds.python import PythonJob

KINDS: dict[str, type[JobKind]] = {}


def register_kind(kind: type[JobKind]) -> type[JobKind]:
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"job kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


register_kind(PythonJob)
register_kind(HttpJob)
