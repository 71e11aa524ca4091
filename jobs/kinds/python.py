"""``python`` jobs: call ``package.module:function`` with the run context."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from jobs.base import JobKind, RunContext
from jobs.declared import JobDeclaration, check
from jobs.errors import JobsConfigError

_TARGET = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _target(value: Any) -> str:
    if not isinstance(value, str) or not _TARGET.fullmatch(value):
        raise ValueError(f"must look like package.module:function, got {value!r}")
    return value


class PythonDeclaration(JobDeclaration):
    """A python job: call ``package.module:function`` with the run's context."""

    kind: Literal["python"]
    target: Annotated[str, check(_target, Annotated[str, Field(pattern=r"^\w+(\.\w+)*:\w+(\.\w+)*$")])]
    """package.module:function, called with the run's context (jobs.base.RunContext)."""

    def build(self, job_id: str) -> PythonJob:
        """The function, imported now: a target that cannot be found stops start-up, not a run."""
        match = _TARGET.fullmatch(self.target)
        assert match is not None  # the declaration checked it
        try:
            found: Any = importlib.import_module(match["module"])
        except Exception as exc:  # any import failure is a config error
            raise JobsConfigError(
                job_id, "target", f"cannot import module {match['module']!r}: {type(exc).__name__}: {exc}"
            ) from None
        for part in match["attr"].split("."):
            if not hasattr(found, part):
                raise JobsConfigError(job_id, "target", f"{self.target!r}: {part!r} not found")
            found = getattr(found, part)
        if not callable(found):
            raise JobsConfigError(job_id, "target", f"{self.target!r} is not callable")
        return PythonJob(self.target, found)


class PythonJob(JobKind):
    name = "python"
    declaration = PythonDeclaration

    def __init__(self, target: str, function: Callable[[RunContext], Any]) -> None:
        self.target = target
        self.function = function

    def calls(self) -> str:
        return f"the Python function {self.target}"

    def run(self, context: RunContext) -> Any:
        return self.function(context)
