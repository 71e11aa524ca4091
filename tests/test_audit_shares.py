"""Issue 24 §7: an audit pass over a fleet larger than one request's share is split across tasks.

The cron request audits the first AUDIT_SHARE_SIZE Scheduler jobs and dispatches the rest in
shares (``/tasks/audit-share``), each a task; here the share is 2 jobs of a fleet of 5, whose
every slot of the day was missed.  However the tasks are delivered (twice, or after the
queue refused them once), each missed slot is reported once.
"""

from __future__ import annotations

import datetime
import logging

import pytest
import webtest
from google.cloud import ndb

from bench.fleet import fleet_files
from devtools.cloud_tasks_fake import to_webtest
from handlers import create_app, tasks
from models.attention_share import AttentionShare
from service import audits

CRON = {"X-Appengine-Cron": "true"}
QUEUE = {"X-AppEngine-QueueName": "dedup-dispatch"}


@pytest.fixture
def fleet(datastore, clock, tmp_path, ndb_client, monkeypatch, caplog):
    # The share's size, as the split (service.audits) and the share's own check (tasks) read it.
    monkeypatch.setattr(audits, "AUDIT_SHARE_SIZE", 2)
    monkeypatch.setattr(tasks, "AUDIT_SHARE_SIZE", 2)
    caplog.set_level(logging.WARNING, logger="dedup.audit")
    clock.advance(12 * 3600)  # 12:00: each job's slot of the day (00:00 to 00:04) passed, none delivered

    def build() -> webtest.TestApp:
        site = webtest.TestApp(create_app(jobs_file=fleet_files(5, str(tmp_path)), clock=clock, ndb_client=ndb_client))
        site.get("/api/v1/scheduler-jobs")  # the schedules recorded
        return site

    return build


def missed_lines(caplog) -> list[tuple[str, str]]:
    return [
        (r.scheduler_job, r.schedule_time)
        for r in caplog.records
        if r.name == "dedup.audit" and getattr(r, "outcome", None) == "missed"
    ]


def attention_shares(count: int) -> list[dict | None]:
    with ndb.Client().context():  # the emulator the test's app uses, named by the environment
        return [e.to_dict() if e else None for e in ndb.get_multi([AttentionShare.key_for(n) for n in range(count)])]


def declared(site) -> list[str]:
    return [job["scheduler_job"] for job in site.get("/api/v1/scheduler-jobs").json["scheduler_jobs"]]


def test_a_pass_audits_its_share_and_dispatches_the_rest_each_slot_reported_once(cloud_tasks, fleet, caplog):
    site = fleet()
    names = declared(site)
    answer = site.get("/tasks/audit", headers=CRON).json
    assert [m["scheduler_job"] for m in answer["missed"]] == names[:2] and answer["scheduler_jobs"] == 5
    assert [(s["first"], s["count"]) for s in answer["shares"]] == [(names[2], 2), (names[4], 1)]
    assert [t.relative_uri for t in cloud_tasks.tasks] == ["/tasks/audit-share"] * 2
    assert [s["task_id"] for s in answer["shares"]] == [t.task_id for t in cloud_tasks.tasks]
    cloud_tasks.deliver(to_webtest(site), times=2)  # each share delivered twice
    assert [t.answers for t in cloud_tasks.tasks] == [[200, 200], [200, 200]]
    reported = missed_lines(caplog)
    assert sorted(job for job, _ in reported) == sorted(names) and len(set(reported)) == len(reported)
    # Each share wrote what it judged, for the home page's order: every job missed its slot.
    assert [(share["first"], share["count"], len(share["jobs"])) for share in attention_shares(3)] == [
        (f"acme-prod/us-central1/{names[0]}", 2, 2),
        (f"acme-prod/us-central1/{names[2]}", 2, 2),
        (f"acme-prod/us-central1/{names[4]}", 1, 1),
    ]
    # Cron's retry of the same pass: the queue refuses its shares, and nothing is reported again.
    again = site.get("/tasks/audit", headers=CRON).json
    assert again["missed"] == [] and all(s["already_dispatched"] for s in again["shares"])
    assert len(cloud_tasks.tasks) == 2 and len(missed_lines(caplog)) == 5


def test_a_share_the_queue_refused_is_audited_by_the_next_pass(cloud_tasks, fleet, caplog, clock):
    site = fleet()
    names = declared(site)
    cloud_tasks.fail_next = [503]  # the first share's task is not created
    answer = site.get("/tasks/audit", headers=CRON).json
    assert [s["task_id"] is None for s in answer["shares"]] == [True, False]
    assert any("wait for the next audit pass" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    clock.advance(300)  # cron's next pass, minutes later
    site.get("/tasks/audit", headers=CRON)
    cloud_tasks.deliver(to_webtest(site))
    assert sorted(job for job, _ in missed_lines(caplog)) == sorted(names)  # each once, none lost


def test_make_runs_shares_in_process(fleet, caplog):
    """Without a queue (make run), the shares run on the process's threads, through the endpoint."""
    site = fleet()
    names = declared(site)
    site.get("/tasks/audit", headers=CRON)
    assert site.app.extensions["dedup"].dispatcher.wait(30) == [200, 200]
    assert sorted(job for job, _ in missed_lines(caplog)) == sorted(names)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"first": "fleet-1"}',
        b'{"count": 1}',
        b'{"first": 1, "count": 1}',
        b'{"first": "fleet-1", "count": 0}',
        b'{"first": "fleet-1", "count": 3}',
        b'{"first": "fleet-1", "count": true}',
        b'{"first": "fleet-1", "count": 1.0}',
        b'{"first": "fleet-1", "count": "1"}',
        b'{"first": "fleet-1", "count": 1, "more": 1}',
    ],
)
def test_a_share_that_is_not_one_is_400_and_audits_nothing(fleet, caplog, body):
    site = fleet()
    answer = site.post(
        "/tasks/audit-share", body, headers={**QUEUE, "Content-Type": "application/json"}, status=400
    ).json
    assert answer["error"] == "InvalidParameterException"
    assert missed_lines(caplog) == []


def test_a_share_of_a_job_no_longer_declared_is_settled(fleet, caplog):
    site = fleet()
    answer = site.post_json("/tasks/audit-share", {"first": "gone-since", "count": 2}, headers=QUEUE).json
    assert answer == {
        "settled": True,
        "status": 404,
        "answer": {"detail": "scheduler.yaml declares no Scheduler job 'gone-since'"},
    }
    assert missed_lines(caplog) == []


def test_only_a_deliverer_audits_a_share(fleet):
    site = fleet()
    site.post_json("/tasks/audit-share", {"first": "fleet-1", "count": 1}, status=403, expect_errors=True)


def test_a_share_audits_the_jobs_from_its_first_in_the_files_order(fleet, caplog):
    site = fleet()
    names = declared(site)
    answer = site.post_json("/tasks/audit-share", {"first": names[1], "count": 2}, headers=QUEUE).json
    assert [m["scheduler_job"] for m in answer["missed"]] == names[1:3] and answer["scheduler_jobs"] == 2
    at = datetime.datetime.fromisoformat(answer["missed"][0]["schedule_time"].replace("Z", "+00:00"))
    assert at.date() == datetime.date(2030, 1, 1)
    # Jobs 1 and 2 are no share of the file's split (0-1, 2-3, 4): their pass writes no share's entity.
    assert attention_shares(3) == [None, None, None]


def test_a_pass_that_fails_or_is_raced_or_cannot_write_leaves_no_attention_to_trust(fleet, monkeypatch, caplog, clock):
    """The home page trusts a share's entity (schedules.attention): a pass that cannot say what it
    judged of every job deletes it, and pages ask the index until a pass writes it whole."""
    site = fleet()
    site.get("/tasks/audit", headers=CRON)
    site.app.extensions["dedup"].dispatcher.wait(30)
    assert all(attention_shares(3))  # each share wrote what it judged
    judge = audits.audit

    def failing(*args, **kwargs):
        raise RuntimeError("Datastore went away after the first batch of marks")

    def raced(*args, **kwargs):
        found = judge(*args, **kwargs)
        found.contended = True  # another pass moved some marks first
        return found

    def refused(*args, **kwargs):
        raise RuntimeError("the entity's commit was refused past its patience")

    for ordinal, (name, patch) in enumerate([("audit", failing), ("audit", raced), ("note_share", refused)]):
        clock.advance(900)
        with monkeypatch.context() as patched:
            patched.setattr(audits, name, patch)
            answer = site.post_json(
                "/tasks/audit-share", {"first": declared(site)[2 * ordinal], "count": 2 if ordinal < 2 else 1},
                headers=QUEUE, expect_errors=True,
            )  # fmt: skip
        assert answer.status_int == (500 if patch is failing else 200), name
        assert attention_shares(3)[ordinal] is None and all(attention_shares(3)[ordinal + 1 :]), ordinal
    assert any("was not written" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
