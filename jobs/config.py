"""Parse and validate jobs.yaml once, at start-up.

Any mistake stops the app with a message naming the job and the field: a
typo found at deploy time costs nothing, one found at 3 a.m. by a
scheduled run costs a missed execution.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import yaml

from dedup.ledger import RunPolicy
from jobs.base import JobKind, positive_number, text_value
from jobs.errors import JobsConfigError
from jobs.kinds import KINDS

DEFAULT_JOBS_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs.yaml")
DEFAULT_LEASE_SECONDS = 600  # the automatic-scaling request timeout
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
COMMON_KEYS = frozenset(
    {
        "kind",
        "lease_seconds",
        "retention_seconds",
        "fingerprint_exclude",
        "heartbeat",
        "max_run_seconds",
        "max_delay_seconds",
        "overlap",
    }
)
# The request timeout of the service's scaling type (DEDUP_SCALING): how long a run may last.
REQUEST_TIMEOUT_SECONDS = {"automatic": 600, "basic": 24 * 3600, "manual": 24 * 3600}
DEFAULT_REQUEST_TIMEOUT = REQUEST_TIMEOUT_SECONDS["automatic"]
# Served at /jobs/<job_id>: keep ids to URL-safe characters.
MAX_JOB_ID_CHARS = 100
_JOB_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_JOB_ID_CHARS - 1}}}")


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
    if not isinstance(document, dict) or set(document) != {"jobs"}:
        raise JobsConfigError(None, None, "must be a mapping with the single key 'jobs'")
    declared = document["jobs"]
    if not isinstance(declared, dict) or not declared:
        raise JobsConfigError(None, "jobs", "must map at least one job id to its settings")
    return {str(job_id): _parse_job(job_id, settings, request_timeout) for job_id, settings in declared.items()}


def _parse_job(job_id: Any, settings: Any, request_timeout: float) -> JobSpec:
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise JobsConfigError(
            str(job_id),
            None,
            "job ids are 1 to 100 letters, digits, '-' and '_', starting with a letter or digit",
        )
    if not isinstance(settings, dict):
        raise JobsConfigError(job_id, None, "settings must be a mapping")
    if "kind" not in settings:
        raise JobsConfigError(job_id, "kind", f"missing; one of {', '.join(sorted(KINDS))}")
    kind_name = settings["kind"]
    kind = KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        raise JobsConfigError(job_id, "kind", f"unknown kind {kind_name!r}; one of {', '.join(sorted(KINDS))}")
    allowed = COMMON_KEYS | kind.required_keys | kind.optional_keys
    for key in settings:
        if key not in allowed:
            raise JobsConfigError(
                job_id,
                str(key),
                f"unknown key for kind {kind_name!r}; allowed: {', '.join(sorted(allowed))}",
            )
    for key in sorted(kind.required_keys):
        if key not in settings:
            raise JobsConfigError(job_id, key, f"missing; kind {kind_name!r} requires it")
    lease = positive_number(job_id, "lease_seconds", settings.get("lease_seconds", DEFAULT_LEASE_SECONDS))
    # The default retention outlives any lease by a day, so a long lease alone is never an error.
    retention = positive_number(
        job_id,
        "retention_seconds",
        settings.get("retention_seconds", max(DEFAULT_RETENTION_SECONDS, lease + 24 * 3600)),
    )
    if retention <= lease:
        raise JobsConfigError(
            job_id,
            "retention_seconds",
            f"must be longer than lease_seconds ({lease}): a record must outlive the attempt "
            "that holds it and the retries after it",
        )
    heartbeat = settings.get("heartbeat", True)
    if not isinstance(heartbeat, bool):
        raise JobsConfigError(job_id, "heartbeat", f"must be true or false, got {heartbeat!r}")
    max_run = positive_number(job_id, "max_run_seconds", settings.get("max_run_seconds", request_timeout))
    exclude = settings.get("fingerprint_exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(name, str) and name for name in exclude):
        raise JobsConfigError(job_id, "fingerprint_exclude", "must be a list of parameter names")
    overlap = settings.get("overlap", "allow")
    if overlap not in ("allow", "forbid"):
        raise JobsConfigError(job_id, "overlap", f"must be allow or forbid, got {overlap!r}")
    max_delay = settings.get("max_delay_seconds")
    if max_delay is not None:
        max_delay = positive_number(job_id, "max_delay_seconds", max_delay)
    options = {key: value for key, value in settings.items() if key not in COMMON_KEYS}
    runner = kind.from_config(job_id, options, lease)
    return JobSpec(
        job_id,
        text_value(job_id, "kind", kind_name),
        RunPolicy(lease, retention, heartbeat=heartbeat, max_run_seconds=max_run, exclusive=overlap == "forbid"),
        runner,
        frozenset(exclude),
        max_delay,
    )


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
