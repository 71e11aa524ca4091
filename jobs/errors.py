"""Errors found in jobs.yaml; they stop the app at start-up."""

from __future__ import annotations


class JobsConfigError(ValueError):
    def __init__(self, job_id: str | None, field: str | None, message: str, source: str = "") -> None:
        self.job_id = job_id
        self.field = field
        self.reason = message
        self.source = source
        super().__init__(self._text())

    def _text(self) -> str:
        where = [self.source or "jobs file"]
        if self.job_id is not None:
            where.append(f"job {self.job_id!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return ": ".join(where) + ": " + self.reason

    def in_file(self, source: str) -> JobsConfigError:
        return JobsConfigError(self.job_id, self.field, self.reason, source)
