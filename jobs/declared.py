"""The types jobs.yaml and scheduler.yaml are declared with, and how a mistake in them reads.

pydantic declares the two files (and so gives their JSON Schema, for editors); each type here
checks its value itself, so that a mistake reads as it did when the files were checked by hand:
the field, what is wrong with it, and what to write instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from jobs.base import MAX_SECONDS, url_problem

if TYPE_CHECKING:
    from jobs.base import JobKind

DEFAULT_LEASE_SECONDS = 600  # the automatic-scaling request timeout
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600


def check(function: Callable[[Any], Any], schema: Any = str) -> PlainValidator:
    """Validation by ``function`` (the value, or ValueError saying what to write instead),
    published in the JSON Schema as ``schema``."""
    return PlainValidator(function, json_schema_input_type=schema)


def field_problem(field: str, message: str) -> PydanticCustomError:
    """What a rule across fields raises: the field to name, and what is wrong with it."""
    return PydanticCustomError("field_problem", "{message}", {"field": field, "message": message})


# What a value must be, by the kind of pydantic error that refused it (its context filled in).
_MUST_BE = {
    "literal_error": "{expected}",
    "less_than_equal": "at most {le}",
    "greater_than_equal": "at least {ge}",
    "int_type": "a whole number",
    "bool_type": "true or false",
}


def reason(error: ErrorDetails) -> str:
    """What is wrong, in the files' words (the errors each file words itself are its own)."""
    context = error.get("ctx") or {}
    kind, value = error["type"], error.get("input")
    if kind in _MUST_BE:
        return f"must be {_MUST_BE[kind].format(**context)}, got {value!r}"
    if kind == "value_error":
        return str(context["error"])
    if kind == "field_problem":
        return str(context["message"])
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be a mapping"
    if kind == "string_type":
        return "must be a string"
    return f"{error['msg']}, got {value!r}"


def error_field(error: ErrorDetails, skip: int) -> str | None:
    """The field an error names: a rule's own, else its place below the first ``skip`` parts, dotted."""
    if error["type"] == "field_problem":
        named = error.get("ctx", {})["field"]
        place = [str(part) for part in error["loc"][skip:]]
        return ".".join([*place, named])
    return ".".join(str(part) for part in error["loc"][skip:]) or None


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= MAX_SECONDS):
        raise ValueError(f"must be a positive number of seconds, at most {MAX_SECONDS}, got {value!r}")
    return value


def non_empty(value: Any) -> str:
    """A string with more than whitespace in it."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _url(query: bool) -> Callable[[Any], str]:
    def url(value: Any) -> str:
        problem = url_problem(non_empty(value), query)
        if problem:
            raise ValueError(problem)
        return str(value)

    return url


_URL_SCHEMA = Annotated[str, Field(pattern="^https?://")]
_SECONDS_SCHEMA = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
_TEXT_SCHEMA = Annotated[str, Field(min_length=1)]
Seconds = Annotated[float, check(_seconds, _SECONDS_SCHEMA)]
Text = Annotated[str, check(non_empty, _TEXT_SCHEMA)]
# Keys that may be left out (None: their default, worked out from other keys) but not written as null.
OmittableSeconds = Annotated[float | None, check(_seconds, _SECONDS_SCHEMA)]
OmittableText = Annotated[str | None, check(non_empty, _TEXT_SCHEMA)]
HttpUrl = Annotated[str, check(_url(True), _URL_SCHEMA)]
BaseUrl = Annotated[str, check(_url(False), _URL_SCHEMA)]


def mapping_of(
    problem: Callable[[Any, Any], str | None], not_a_mapping: str = "must be a mapping"
) -> Callable[[Any], dict[str, Any]]:
    """A check of a mapping whose every (name, value) passes ``problem`` (what is wrong, or None)."""

    def mapping(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValueError(not_a_mapping)
        for name, item in value.items():
            wrong = problem(name, item)
            if wrong:
                raise ValueError(wrong)
        return dict(value)

    return mapping


def _parameter_names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise ValueError("must be a list of parameter names")
    return tuple(value)


class Declaration(BaseModel):
    """A part of jobs.yaml or scheduler.yaml: no key it does not declare, no value coerced from
    another type ("10" is no number of seconds, "yes" no boolean), frozen once read."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


class JobDeclaration(Declaration):
    """A job in jobs.yaml: the keys every kind takes.  A kind's declaration adds ``kind`` (a
    Literal of its name) and its own keys, and builds the kind's runner from them (``build``)."""

    kind: str
    """The job's kind: python, http, workflow, cloud_run_job, cloud_build_trigger or external (docs/jobs.md)."""
    lease_seconds: Seconds = DEFAULT_LEASE_SECONDS
    """How long an attempt holds its run before another may take it over, in seconds."""
    retention_seconds: OmittableSeconds = None
    """How long a run's record is kept, in seconds: by default a week, or the lease and a day."""
    heartbeat: bool = True
    """Renew the lease while the job runs."""
    max_run_seconds: OmittableSeconds = None
    """How long a run may last, renewals included, in seconds: by default the request timeout."""
    fingerprint_exclude: Annotated[tuple[str, ...], check(_parameter_names, list[str])] = ()
    """Manual-run parameters left out of the client token's fingerprint."""
    overlap: Literal["allow", "forbid"] = "allow"
    """forbid: no run starts while another run of the job holds its lease."""
    max_delay_seconds: Seconds | None = None
    """A delivery whose schedule time is older than this is skipped, not run, in seconds."""

    @property
    def retention(self) -> float:
        # The default outlives any lease by a day, so a long lease alone is never an error.
        return self.retention_seconds or max(DEFAULT_RETENTION_SECONDS, self.lease_seconds + 24 * 3600)

    @model_validator(mode="after")
    def retention_outlives_lease(self) -> Self:
        if self.retention <= self.lease_seconds:
            raise field_problem(
                "retention_seconds",
                f"must be longer than lease_seconds ({self.lease_seconds}): a record must outlive the attempt "
                "that holds it and the retries after it",
            )
        return self

    def build(self, job_id: str) -> JobKind:
        """The kind's runner, as these keys describe it (JobsConfigError for what only building finds)."""
        raise NotImplementedError
