"""``python`` jobs: call ``package.module:function`` with the run context."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from jobs.base import JobKind, RunContext
from jobs.errors import JobsConfigError

_TARGET = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


class PythonJob(JobKind):
    name = "python"
    required_keys = frozenset({"target"})

    def __init__(self, target: str, function: Callable[[RunContext], Any]) -> None:
        self.target = target
        self.function = function

    def calls(self) -> str:
        return f"the Python function {self.target}"

    @classmethod
    def from_config(cls, job_id: str, options: Mapping[str, Any], lease_seconds: float) -> PythonJob:
        target = options["target"]
        match = _TARGET.fullmatch(target) if isinstance(target, str) else None
        if match is None:
            raise JobsConfigError(job_id, "target", f"must look like package.module:function, got {target!r}")
        try:
            found: Any = importlib.import_module(match["module"])
        except Exception as exc:  # any import failure is a config error
            raise JobsConfigError(
                job_id, "target", f"cannot import module {match['module']!r}: {type(exc).__name__}: {exc}"
            ) from None
        for part in match["attr"].split("."):
            if not hasattr(found, part):
                raise JobsConfigError(job_id, "target", f"{target!r}: {part!r} not found")
            found = getattr(found, part)
        if not callable(found):
            raise JobsConfigError(job_id, "target", f"{target!r} is not callable")
        return cls(target, found)

    def run(self, context: RunContext) -> Any:
        return self.function(context)
