"""handlers/answers.py, the answers table: every outcome and every refusal has its row, and every
surface renders the same row.  No emulator: the records are built in an offline NDB context."""

from __future__ import annotations

import datetime
import typing

import pytest
from flask import Flask
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dedup.answers import answer
from dedup.outcomes import (
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
from dedup.runner import Waiting
from handlers.answers import Answerable, answer_of, outcome_response, page_status, run_answer, task_answer
from handlers.problems import TYPES_BY_ERROR
from handlers.responses import guarded_response, manual_run_response
from models import RunRecord, RunStatus
from service.errors import Declined, Invalid, NotFound, RefusalKind

NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
MINUTE = datetime.timedelta(minutes=1)


@pytest.fixture(autouse=True)
def offline_context():
    """NDB builds keys in a context; this one's client never calls out."""
    client = ndb.Client(project="answers-table", credentials=AnonymousCredentials())
    with client.context(), Flask(__name__).test_request_context():
        yield


def record(status: RunStatus, **fields) -> RunRecord:
    values = {
        "source": "api",
        "job_id": "nightly",
        "status": status.value,
        "attempt_id": "a" * 32,
        "attempt": 2,
        "lease_expires": NOW + MINUTE,
        "expire_at": NOW + 60 * MINUTE,
        "created": NOW - 10 * MINUTE,
        "result": {"n": 1} if status == RunStatus.COMPLETED else None,
        "error": None if status == RunStatus.COMPLETED else {"type": "Boom", "message": "boom"},
        "requested_by": "user:op@example.com",
        **fields,
    }
    return RunRecord(id="run", **values)


def samples() -> list[Answerable]:
    """One of each member of the union the table answers (and the variants a row depends on)."""
    return [
        Finished(record(RunStatus.COMPLETED)),
        Finished(record(RunStatus.FAILED)),
        Replayed(record(RunStatus.COMPLETED)),
        Skipped(record(RunStatus.SKIPPED)),
        Released("run", 2, {"type": "Boom", "message": "boom"}),
        Conflict(record(RunStatus.COMPLETED)),
        JobMismatch(record(RunStatus.COMPLETED), job_id="other"),
        InProgress(record(RunStatus.IN_PROGRESS), 42),
        Contended("run", 2),
        Overlap("run", "holder", 7),
        Stale("run", 1, record(RunStatus.IN_PROGRESS)),
        NotFound("no job"),
        Invalid("a bad time"),
        *(Declined(kind, f"declined: {kind}", {"attempt": 2}) for kind in RefusalKind),
    ]


def members(union: object) -> set[type]:
    return set(typing.get_args(union))


def test_every_sample_is_rendered():
    assert len(samples()) == 13 + len(RefusalKind)


def test_the_table_answers_every_member_of_the_union():
    """An outcome or a refusal added to the union fails mypy in answer_of (assert_never); here,
    the samples must cover it too, so each member's row is seen to render."""
    assert members(Answerable) == members(RunOutcome) | {NotFound, Invalid, Declined}
    assert {type(sample) for sample in samples()} == members(Answerable)


@pytest.mark.parametrize("index", range(13 + len(RefusalKind)))
def test_every_surface_renders_the_one_row(index):
    """Each sample (built in the test: NDB makes keys only in a context) as every surface renders it."""
    said = samples()[index]
    answer = answer_of(said)
    if answer.error is not None and answer.error != "NotFound":
        assert TYPES_BY_ERROR[answer.error].status == answer.status  # the problem type's own status
    assert page_status(said) == answer.status  # the dashboard's page
    task = task_answer(said)
    if isinstance(said, NotFound | Invalid | Declined):
        assert task.status_code == 200 and task.json == {
            "settled": True,
            "status": answer.status,
            "answer": {**({"error": str(said.kind)} if isinstance(said, Declined) else {}), "detail": said.message},
        }
        return
    response = outcome_response(said)  # the JSON surfaces: a delivery, a slot run, the guard
    assert response.status_code == answer.status
    assert response.headers.get("Retry-After") == (None if answer.retry_after is None else str(answer.retry_after))
    assert response.headers["X-Dedup-Run-Id"] == said.run_id
    if answer.error is not None:
        assert response.json["error"] == answer.error and response.json["status"] == answer.status
        assert response.json["title"] == answer.title
    if answer.status in (409, 500) or answer.status < 300:
        assert task.status_code == answer.status  # a retry may cure it, or it succeeded: as itself
    else:
        assert task.status_code == 200 and task.json["settled"] and task.json["status"] == answer.status


def test_a_run_has_one_answer_shape_and_the_run_api_adds_to_it():
    """A run's document is the same whichever surface asked; a manual run's adds clientToken and
    requested_by (and 201 for the run the request made), never replacing a member."""
    finished = Finished(record(RunStatus.COMPLETED))
    delivered = run_answer(finished)
    manual = manual_run_response(finished, "nightly", "token-1", {}, (), Waiting(0))
    assert delivered.status_code == 200 and manual.status_code == 201
    assert manual.json == {**delivered.json, "clientToken": "token-1", "requested_by": "user:op@example.com"}
    replayed = Replayed(record(RunStatus.FAILED))
    again = manual_run_response(replayed, "nightly", "token-1", {}, (), Waiting(0))
    assert again.status_code == run_answer(replayed).status_code == 422
    assert again.json["duplicate"] is True and again.headers["Idempotent-Replayed"] == "true"


def test_a_client_under_its_token_has_rows_of_its_own_in_the_table():
    """A manual run or a guarded call: the run its request made is 201, and it polls, so a run in
    progress says at most 30 s; every other row is the table's, whoever asked."""
    assert answer_of(Finished(record(RunStatus.COMPLETED)), client=True).status == 201
    assert answer_of(Finished(record(RunStatus.FAILED)), client=True).status == 422
    busy = InProgress(record(RunStatus.IN_PROGRESS), 42)
    assert answer_of(busy).retry_after == 42 and answer_of(busy, client=True).retry_after == 30
    for said in samples():
        if not isinstance(said, Finished | InProgress):
            assert answer_of(said, client=True) == answer_of(said)


def test_a_released_guarded_call_is_answered_by_the_table():
    """A guarded call released before its view answered is the table's RetryableFailure, not a row of the guard's."""
    released = Released("run", 2, {"type": "Boom", "message": "boom"})
    response = guarded_response(released, [], {}, (), {})
    assert response.status_code == 500 and response.json["error"] == answer_of(released).error == "RetryableFailure"


@pytest.mark.parametrize("index", range(11))  # the samples of a run's outcomes
def test_the_librarys_framework_free_answer_is_the_apps(index):
    """dedup.answers.answer, what a handler without Flask sends, is what the app's JSON answer
    sends: status, headers and document, for every outcome of a run."""
    outcome = samples()[index]
    assert not isinstance(outcome, NotFound | Invalid | Declined)
    said = answer(outcome, at="/jobs/nightly")
    with Flask(__name__).test_request_context("/jobs/nightly"):
        sent = run_answer(outcome)
    assert said.status == sent.status_code and sent.get_data() == said.body()  # the same bytes
    assert {name: sent.headers[name] for name in said.headers} == said.headers
    assert sent.mimetype == said.media_type
    assert said.status != 503 and (said.media_type == "application/json") == (answer_of(outcome).error is None)
