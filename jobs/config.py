"""Parse and validate jobs.yaml once, at start-up.

Any mistake stops the app with a message naming the job and the field: a
typo found at deploy time costs nothing, one found at 3 a.m. by a
scheduled run costs a missed execution.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
from collections.abc import Hashable
from typing import TYPE_CHECKING, Annotated, Any, cast

import pydantic
import yaml
from pydantic_core import ErrorDetails

from dedup.ledger import RunPolicy
from dedup.run_record import MAX_JOB_ID_CHARS
from jobs.base import JobKind
from jobs.declared import Declaration, JobDeclaration, error_field, reason
from jobs.errors import JobsConfigError
from jobs.kinds import KINDS

DEFAULT_JOBS_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs.yaml")
# The request timeout of the service's scaling type (DEDUP_SCALING): how long a run may last.
REQUEST_TIMEOUT_SECONDS = {"automatic": 600, "basic": 24 * 3600, "manual": 24 * 3600}
DEFAULT_REQUEST_TIMEOUT = REQUEST_TIMEOUT_SECONDS["automatic"]
# Served at /jobs/<job_id>: keep ids to URL-safe characters.
JOB_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_JOB_ID_CHARS - 1}}}$"


@dataclasses.dataclass(frozen=True)
class JobSpec:
    job_id: str
    kind: str
    policy: RunPolicy
    runner: JobKind
    # Manual-run parameters left out of the client-token fingerprint (as ECS
    # leaves out Region and Availability Zone).
    fingerprint_exclude: frozenset[str] = frozenset()
    # A delivery whose schedule time is older than this is skipped, not run (Quartz's misfire
    # threshold, Kubernetes' startingDeadlineSeconds); None: every delivery runs, however late.
    max_delay_seconds: float | None = None


def load_jobs(path: str, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> dict[str, JobSpec]:
    """Read and validate a jobs file; raise JobsConfigError naming job and field.

    ``request_timeout``: the service's (Settings.request_timeout, of DEDUP_SCALING), a job's
    max_run_seconds when it gives none."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise JobsConfigError(None, None, f"cannot read: {exc.strerror}", path) from None
    except UnicodeDecodeError as exc:
        raise JobsConfigError(None, None, f"not UTF-8 text: {exc}", path) from None
    try:
        return parse_jobs(text, request_timeout)
    except JobsConfigError as exc:
        raise exc.in_file(path) from None


def parse_jobs(text: str, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> dict[str, JobSpec]:
    try:
        document = load_strict_yaml(text)
    except DuplicateKeyError as exc:
        raise JobsConfigError(
            None,
            str(exc.key),
            (f"declared twice (again at line {exc.line}); job ids and the keys of a job must be unique"),
        ) from None
    except yaml.YAMLError as exc:
        raise JobsConfigError(None, None, f"not valid YAML: {exc}") from None
    try:
        declared = jobs_file_model().model_validate(document)
    except pydantic.ValidationError as exc:
        raise _config_error(exc.errors()[0]) from None
    return {job_id: _spec(job_id, job, request_timeout) for job_id, job in declared.jobs.items()}


class JobsFile(Declaration):
    """The jobs this app serves, each at /jobs/<job_id> (docs/jobs.md)."""

    jobs: dict[str, JobDeclaration]


@functools.cache
def jobs_file_model() -> type[JobsFile]:
    """jobs.yaml as a model: ``jobs``, each job declared by its kind's declaration (KINDS)."""
    declarations = functools.reduce(operator.or_, (kind.declaration for kind in KINDS.values()))
    job = cast(Any, Annotated)[declarations, pydantic.Field(discriminator="kind")]
    job_id = Annotated[str, pydantic.StringConstraints(pattern=JOB_ID_PATTERN)]
    jobs = cast(Any, Annotated)[dict[job_id, job], pydantic.Field(min_length=1)]  # type: ignore[valid-type]
    return pydantic.create_model(
        "JobsFile",
        __base__=JobsFile,
        __doc__=JobsFile.__doc__,
        jobs=(jobs, ...),
    )


def _config_error(error: ErrorDetails) -> JobsConfigError:
    """The first thing wrong in jobs.yaml, as the file's readers were always told it."""
    place, kind = error["loc"], error["type"]
    kinds = ", ".join(sorted(KINDS))
    if place[:1] != ("jobs",) or (place == ("jobs",) and kind == "missing"):
        return JobsConfigError(None, None, "must be a mapping with the single key 'jobs'")
    if place == ("jobs",):
        return JobsConfigError(None, "jobs", "must map at least one job id to its settings")
    job_id = str(place[1])
    if place[2:] == ("[key]",):
        return JobsConfigError(
            job_id,
            None,
            f"job ids are 1 to {MAX_JOB_ID_CHARS} letters, digits, '-' and '_', starting with a letter or digit",
        )
    if kind == "union_tag_not_found":
        return JobsConfigError(job_id, "kind", f"missing; one of {kinds}")
    if kind == "union_tag_invalid":
        return JobsConfigError(job_id, "kind", f"unknown kind {error['input']['kind']!r}; one of {kinds}")
    if len(place) == 2:
        return JobsConfigError(job_id, None, "settings must be a mapping")
    kind_name = str(place[2])
    field = error_field(error, skip=3)
    if kind == "missing":
        return JobsConfigError(job_id, field, f"missing; kind {kind_name!r} requires it")
    if kind in ("extra_forbidden", "invalid_key"):
        allowed = ", ".join(sorted(KINDS[kind_name].declaration.model_fields))
        return JobsConfigError(job_id, field, f"unknown key for kind {kind_name!r}; allowed: {allowed}")
    return JobsConfigError(job_id, field, reason(error))


def _spec(job_id: str, job: JobDeclaration, request_timeout: float) -> JobSpec:
    policy = RunPolicy(
        job.lease_seconds,
        job.retention,
        heartbeat=job.heartbeat,
        max_run_seconds=job.max_run_seconds or request_timeout,
        exclusive=job.overlap == "forbid",
    )
    runner = job.build(job_id)
    return JobSpec(job_id, job.kind, policy, runner, frozenset(job.fingerprint_exclude), job.max_delay_seconds)


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"{key!r} is declared twice (again at line {line})")
        self.key, self.line = key, line


# libyaml's parser where PyYAML was built with it (its wheels are): the pure-Python one takes
# about 10 ms a file, paid by every worker's start-up and every ops command.
if TYPE_CHECKING or yaml.__with_libyaml__:
    _SafeLoader = yaml.CSafeLoader
else:  # pragma: no cover - a PyYAML built without libyaml
    _SafeLoader = yaml.SafeLoader


class _StrictLoader(_SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_strict_yaml(stream: Any) -> Any:
    """YAML as safe_load reads it, except that a key given twice is an error (DuplicateKeyError)."""
    return yaml.load(stream, Loader=_StrictLoader)  # a safe loader subclass
