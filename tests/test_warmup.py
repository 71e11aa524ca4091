"""App Engine's warmup request (issue 40 §5): declared in app.yaml, answered by /_ah/warmup.

App Engine sends it from 0.1.0.3, which no trusted marker covers, so the view is open to every
caller; it warms the worker once and answers nothing else, and every other route still
refuses the same caller.
"""

from __future__ import annotations

import os

import yaml

from tests.support.callers import appengine_app  # noqa: F401 - fixture
from tests.support.deliveries import JOBS
from tests.support.routes import every_route

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = {"X-Appengine-User-Ip": "0.1.0.3"}  # where App Engine's warmup comes from (its firewall docs)


def test_app_yaml_asks_for_warmup_requests():
    with open(os.path.join(ROOT, "app.yaml"), encoding="utf-8") as handle:
        assert "warmup" in yaml.safe_load(handle)["inbound_services"]


def test_warmup_is_answered_to_app_engine_and_warms_once(appengine_app, ndb_client):
    first = appengine_app.get("/_ah/warmup", headers=WARMUP, status=200)
    assert first.content_type == "text/plain" and first.text.startswith("warmed in ")
    again = appengine_app.get("/_ah/warmup", status=200)  # anyone: no marker at all
    assert again.text == "warm\n"
    # A GET only, as App Engine sends it: any other method is a request no route takes, which
    # the gate answers first, as everywhere (a stranger learns 401, never what the app serves).
    appengine_app.post("/_ah/warmup", status=401)


def test_warmup_writes_nothing_and_says_nothing_of_the_app(appengine_app, ndb_client):
    from google.cloud import ndb

    answers = [appengine_app.get("/_ah/warmup", headers=WARMUP).text for _ in range(3)]
    assert all(len(text) < 40 for text in answers) and "warm" in answers[-1]
    with ndb_client.context():
        assert ndb.Query().fetch(keys_only=True) == []  # read, never written


def test_every_other_route_still_refuses_the_warmups_caller(appengine_app):
    app = appengine_app.app
    for path, methods in every_route(app):
        if path == "/_ah/warmup":
            continue
        for method in methods:
            answer = appengine_app.request(path, method=method, headers=WARMUP, expect_errors=True)
            assert answer.status_int in (401, 403), (method, path, answer.status_int)


def test_each_app_warms_once_and_a_worker_warms_before_it_serves(make_client):
    """Two apps in one process (as tests and benchmarks build them) each warm once; a worker that
    warmed before serving (gunicorn.conf.py) answers App Engine's request at once."""
    from handlers import warm_worker

    first, second = make_client(JOBS), make_client(JOBS)
    assert first.get("/_ah/warmup").text.startswith("warmed in ")
    assert second.get("/_ah/warmup").text.startswith("warmed in ")
    assert first.get("/_ah/warmup").text == second.get("/_ah/warmup").text == "warm\n"
    worker = make_client(JOBS)
    assert warm_worker(worker.app) is True and warm_worker(worker.app) is False
    assert worker.get("/_ah/warmup").text == "warm\n"


def test_off_app_engine_the_loopback_rule_still_holds_for_warmup(make_client):
    """Where the app trusts forgeable markers (DEDUP_AUTH=none here), it serves loopback alone:
    warmup too, against DNS rebinding."""
    client = make_client(JOBS)
    client.get("/_ah/warmup", headers={"Host": "attacker.example"}, status=401)
    assert client.get("/_ah/warmup", headers={"Host": "127.0.0.1:8080"}).status_int == 200


def test_a_warmup_that_cannot_reach_datastore_still_answers_and_is_not_redone(make_client, monkeypatch):
    from handlers import warmup

    client = make_client(JOBS)

    def unreachable(app):
        raise ConnectionError("Datastore is not answering")

    monkeypatch.setattr(warmup, "_warm", unreachable)
    assert client.get("/_ah/warmup").text.startswith("warmed in ")  # logged, answered
    assert client.get("/_ah/warmup").text == "warm\n"  # not tried again by strangers
