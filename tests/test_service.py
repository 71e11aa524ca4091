"""service/'s decisions without Flask, HTTP or an emulator: the request types' parsing, the
refusals' types, and the one answer-or-queue rule every queued action shares."""

from __future__ import annotations

import datetime
import types

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import ndb

from dispatch import Dispatched, DispatchError, Work
from models import RunRecord, RunStatus
from service.errors import Declined, Invalid, NotFound, Refusal, RefusalKind
from service.pauses import ScheduleChangeRequest, pause_schedule, resume_schedule
from service.runs import Queued, answer_or_queue
from service.slots import SlotRunRequest

NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
MINUTE = datetime.timedelta(minutes=1)


@pytest.fixture(autouse=True)
def offline_context():
    """NDB builds keys in a context; this one's client never calls out."""
    with ndb.Client(project="service-decisions", credentials=AnonymousCredentials()).context():
        yield


class Queue:
    """A dispatcher that keeps what it is given, or refuses it all."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list[Work] = []
        self.refuse = refuse

    def dispatch(self, work: Work) -> Dispatched:
        if self.refuse:
            raise DispatchError("the queue is paused")
        self.sent.append(work)
        return Dispatched(work.task_id)


def state(queue: Queue, schedules: tuple = ()) -> types.SimpleNamespace:
    return types.SimpleNamespace(clock=types.SimpleNamespace(now=lambda: NOW), dispatcher=queue, schedules=schedules)


def record(status: RunStatus, lease: datetime.timedelta = MINUTE) -> RunRecord:
    return RunRecord(id="run", job_id="nightly", status=status.value, attempt=3, lease_expires=NOW + lease)


def work(seen: int) -> Work:
    return Work(f"task-{seen}", "/tasks/run-slot", {"attempt": seen})


@pytest.mark.parametrize(
    ("stored", "reopen", "queued_at"),
    [
        (None, None, 0),  # no record: the first attempt is queued
        (lambda: record(RunStatus.RELEASED), None, 3),  # released: the next attempt
        (lambda: record(RunStatus.IN_PROGRESS, lease=-MINUTE), None, 3),  # its lease ran out
        (lambda: record(RunStatus.FAILED), 3, 3),  # failed, reopened at the attempt seen
        (lambda: record(RunStatus.COMPLETED), None, None),  # done: answered from its record
        (lambda: record(RunStatus.IN_PROGRESS), None, None),  # running: answered
        (lambda: record(RunStatus.FAILED), None, None),  # failed, no attempt seen: answered
        (lambda: record(RunStatus.SKIPPED), 2, None),  # replaced since the attempt seen: answered
    ],
)
def test_an_action_is_answered_from_the_record_or_queued(stored, reopen, queued_at):
    queue = Queue()
    found = stored() if stored else None
    done = answer_or_queue(state(queue), "run", found, lambda: "answered", work, reopen_attempt=reopen)
    if queued_at is None:
        assert done == "answered" and queue.sent == []
    else:
        assert done == Queued("run", queued_at, Dispatched(f"task-{queued_at}"))
        assert [sent.task_id for sent in queue.sent] == [f"task-{queued_at}"]


def test_a_queue_that_takes_nothing_is_the_callers_to_say():
    with pytest.raises(DispatchError):
        answer_or_queue(state(Queue(refuse=True)), "run", None, lambda: "answered", work)


@pytest.mark.parametrize(
    ("attempt", "force", "said"),
    [(None, None, SlotRunRequest(None)), ("0", "false", SlotRunRequest(0)), ("7", "true", SlotRunRequest(7, True))],
)
def test_a_slot_run_request_as_any_surface_sends_it(attempt, force, said):
    assert SlotRunRequest.parse(attempt, force) == said


MALFORMED = [("-1", None), ("1e3", None), ("\u0661", None), ("9999999", None), ("1", "yes")]


@pytest.mark.parametrize(("attempt", "force"), MALFORMED)
def test_a_malformed_slot_run_request_is_invalid(attempt, force):
    with pytest.raises(Invalid):
        SlotRunRequest.parse(attempt, force)


def test_a_pause_or_resume_checks_what_it_was_sent_before_it_looks_for_the_job():
    """Invalid (a 400 on every surface) before NotFound: the same order the API always had."""
    with pytest.raises(Invalid, match="note must be a string"):
        pause_schedule(state(Queue()), None, ScheduleChangeRequest("nightly", note=7))
    with pytest.raises(Invalid, match="catch_up must be one of none, latest, all"):
        resume_schedule(state(Queue()), None, ScheduleChangeRequest("nightly", catch_up="some"))
    with pytest.raises(NotFound, match="no schedule is loaded"):
        resume_schedule(state(Queue()), None, ScheduleChangeRequest("nightly"))


def test_every_refusal_is_one_of_three_and_says_why():
    declined = Declined(RefusalKind.SLOT_NOT_DUE, "not yet", {"execution_status": "upcoming"})
    for refusal in (NotFound("no job"), Invalid("bad"), declined):
        assert isinstance(refusal, Refusal) and refusal.message
    assert declined.kind == "SlotNotDue" and declined.details == {"execution_status": "upcoming"}
