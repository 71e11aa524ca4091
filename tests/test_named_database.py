"""DEDUP_DATABASE: the ledger in a named Datastore-mode database (dedup/database.py), on both emulators.

A project whose ``(default)`` database is in Firestore native mode hosts the ledger in a database
of its own; the app's client, its start-up check and every record it writes go there.
"""

from __future__ import annotations

import pytest
import webtest
from google.cloud import ndb

from dedup import database, fence_check, fence_probe
from handlers import SettingError, create_app
from models import RunRecord
from tests.support.deliveries import JOBS, deliver

pytestmark = pytest.mark.both_emulators

LEDGER = "ledger-db"


def test_the_ledger_lives_in_the_database_dedup_database_names(datastore, jobs_file, clock, monkeypatch):
    monkeypatch.setenv("DEDUP_DATABASE", LEDGER)
    app = create_app(jobs_file=jobs_file(JOBS), clock=clock)  # its own client, made from the environment
    client = webtest.TestApp(app)
    answer = deliver(client, status=200).json
    named = ndb.Client(project=datastore.project, database=LEDGER)
    fence_probe.verify(named)  # as the app's start-up thread does (it may not have answered yet)
    with named.context():
        assert RunRecord.get_by_id(answer["run_id"]) is not None
    with ndb.Client(project=datastore.project).context():
        assert RunRecord.get_by_id(answer["run_id"]) is None  # not in (default)
    status = client.get("/api/v1/status").json["datastore"]
    assert status["database"] == LEDGER
    assert fence_check.database_of(named) == (datastore.project, LEDGER)


@pytest.mark.parametrize(
    "name", ["Ledger", "abc", "1ledger", "ledger-", "a" * 64, "ledger_db", "(other)", "l\u00e9dger"]
)
def test_a_name_firestore_would_refuse_stops_the_app_and_the_cli_alike(name, jobs_file, monkeypatch):
    from deploy.bootstrap import BootstrapError, database_name

    monkeypatch.setenv("DEDUP_DATABASE", name)
    with pytest.raises(SettingError, match="DEDUP_DATABASE"):
        create_app(jobs_file=jobs_file(JOBS))
    with pytest.raises(BootstrapError, match="not a database id"):
        database_name(name)


@pytest.mark.parametrize("value, chosen", [("", None), ("  ", None), ("(default)", None), ("ledger-db", "ledger-db")])
def test_unset_or_default_is_the_default_database(value, chosen):
    assert database.client_database({"DEDUP_DATABASE": value}) == chosen
