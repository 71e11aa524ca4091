"""Client-token idempotency: the same key and parameters take effect once.

The guard is the ledger seen from a caller who supplies a key (a client
token, an ``Idempotency-Key`` header): the key is scoped (per job, per
tenant, ...), the parameters are fingerprinted so a reused key with other
parameters is refused.  A guarded call is remembered at least 24 hours after
it finishes (Stripe's and idempot-js's window, the one clients are taught);
manual runs follow the Amazon ECS client-token rule instead, min(created + 24 h,
finished + 1 h).  Manual runs and any guarded endpoint use this one
implementation; the Flask decorator lives in dedup/adapters/flask_guard.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any, assert_never

from dedup.errors import PermanentJobError
from dedup.keys import digest_parts
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.outcomes import (
    Attempt,
    Conflict,
    Contended,
    Finished,
    InProgress,
    JobMismatch,
    Overlap,
    Released,
    Replayed,
    RunOutcome,
    Skipped,
    Stale,
)
from dedup.run_record import RunSource, RunStatus
from dedup.runner import Verdict, Waiting, run_once

log = logging.getLogger(__name__)

KEY_VERSION = "guard/v1"
# Manual runs' client tokens (the ECS rule): 24 h from creation, and at most 1 h after the finish.
TOKEN_LIFETIME_SECONDS = 24 * 3600
FINISHED_TOKEN_LIFETIME_SECONDS = 3600
# A guarded call's key: remembered at least this long after the call finishes (and its lease).
GUARD_KEY_LIFETIME_SECONDS = 24 * 3600
DEFAULT_POLICY = RunPolicy(lease_seconds=60, retention_seconds=GUARD_KEY_LIFETIME_SECONDS)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def fingerprint(parameters: Mapping[str, Any] | None, exclude: Collection[str] = ()) -> str:
    """SHA-256 over canonical JSON of the parameters, without the excluded names."""
    kept = {name: value for name, value in (parameters or {}).items() if name not in exclude}
    return hashlib.sha256(canonical_json(kept).encode("utf-8")).hexdigest()


def differing_names(
    stored: Mapping[str, Any] | None, given: Mapping[str, Any] | None, exclude: Collection[str] = ()
) -> list[str]:
    """The parameter names whose values differ (present on one side only counts)."""
    stored, given = stored or {}, given or {}
    names = (set(stored) | set(given)) - set(exclude)
    return sorted(
        name
        for name in names
        if (name in stored) != (name in given) or canonical_json(stored[name]) != canonical_json(given[name])
    )


class IdempotencyConflict(Exception):
    """The key was used before with other parameters."""

    def __init__(self, run_id: str, differing: list[str]) -> None:
        super().__init__(f"idempotency key reused with different parameters: {', '.join(differing)}")
        self.run_id = run_id
        self.differing = differing


class IdempotencyJobMismatch(IdempotencyConflict):
    """The key names a run of another job: a configuration error, never replayed."""

    def __init__(self, run_id: str, job_id: str, recorded_job_id: str) -> None:
        Exception.__init__(
            self,
            f"idempotency key of a run of {recorded_job_id!r}, not of {job_id!r}: neither run nor "
            "answered from that run; use a scope or key that tells the jobs apart",
        )
        self.run_id = run_id
        self.differing = ["job_id"]
        self.job_id = job_id
        self.recorded_job_id = recorded_job_id


class IdempotencyInProgress(Exception):
    """Another call with this key is still running."""

    def __init__(self, run_id: str, retry_after_seconds: int) -> None:
        super().__init__(f"a call with this idempotency key is in progress; retry in {retry_after_seconds}s")
        self.run_id = run_id
        self.retry_after_seconds = retry_after_seconds


@dataclasses.dataclass(frozen=True)
class IdempotencyGuard:
    """Run work once per (namespace, scope, key), refusing reuse with other parameters."""

    ledger: Ledger
    namespace: str
    policy: RunPolicy = DEFAULT_POLICY
    source: str = RunSource.GUARD

    def run_id(self, key: str, scope: str = "") -> str:
        return digest_parts(KEY_VERSION, self.namespace, scope, key)

    def run(
        self,
        key: str,
        work: Callable[[Attempt], Any],
        *,
        scope: str = "",
        parameters: Mapping[str, Any] | None = None,
        exclude: Collection[str] = (),
        policy: RunPolicy | None = None,
        classify: Callable[[Any], Verdict] | None = None,
        wait: Waiting | None = None,
        job_id: str | None = None,
        requested_by: str | None = None,
    ) -> RunOutcome:
        """``job_id`` names what ran in the record (default: the namespace); ``requested_by`` who asked."""
        parameters = dict(parameters or {})
        description = RunDescription(
            source=self.source,
            job_id=job_id or self.namespace,
            client_token=key,
            scope=scope,
            parameters=parameters,
            fingerprint=fingerprint(parameters, exclude),
            requested_by=requested_by,
        )
        return run_once(
            self.ledger,
            self.run_id(key, scope),
            description,
            policy or self.policy,
            work,
            classify=classify,
            wait=wait,
        )

    def wrap(
        self,
        key: Callable[..., str],
        *,
        scope: Callable[..., str] | None = None,
        parameters: Callable[..., Mapping[str, Any]] | None = None,
        exclude: Collection[str] = (),
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a plain function: one effect per key; a retry returns the stored result.

        ``key``, ``scope`` and ``parameters`` receive the function's arguments.
        A stored permanent failure is raised again as PermanentJobError; a
        call in flight raises IdempotencyInProgress; other parameters raise
        IdempotencyConflict; any other exception releases the key and is
        raised to the caller.
        """

        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(function)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                given = dict(parameters(*args, **kwargs)) if parameters else {}
                raised: list[BaseException] = []

                def work(attempt: Attempt) -> Any:
                    try:
                        return function(*args, **kwargs)
                    except Exception as exc:
                        raised.append(exc)
                        raise

                outcome = self.run(
                    key(*args, **kwargs),
                    work,
                    scope=scope(*args, **kwargs) if scope else "",
                    parameters=given,
                    exclude=exclude,
                )
                return unwrap_plain_outcome(outcome, given, exclude, raised)

            return guarded

        return decorate


def unwrap_plain_outcome(
    outcome: RunOutcome, given: Mapping[str, Any], exclude: Collection[str], raised: list[BaseException]
) -> Any:
    """The function's result, or what the outcome means raised; ``raised``: what the function raised."""
    match outcome:
        case Finished() | Replayed():
            record = outcome.record
            if record.status == RunStatus.COMPLETED:
                return record.result
            error = record.error or {}
            raise PermanentJobError(error.get("message", "failed"), details=error.get("details"))
        case Conflict():
            raise IdempotencyConflict(outcome.record.run_id, differing_names(outcome.record.parameters, given, exclude))
        case JobMismatch():
            log.error(
                "run %s: the key names a run of %r, not of %r",
                outcome.record.run_id,
                outcome.record.job_id,
                outcome.job_id,
            )
            raise IdempotencyJobMismatch(outcome.record.run_id, outcome.job_id, outcome.record.job_id)
        case InProgress():
            raise IdempotencyInProgress(outcome.record.run_id, outcome.retry_after_seconds)
        case Released() if raised:
            raise raised[0]
        # Contended, or a stale attempt: another call owns the key now.
        case Contended() | Overlap():
            raise IdempotencyInProgress(outcome.run_id, outcome.retry_after_seconds)
        case Released() | Stale() | Skipped():
            raise IdempotencyInProgress(outcome.run_id, 1)
        case _:
            assert_never(outcome)
