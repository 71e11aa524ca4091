"""GET /api/v1/runs and /api/v1/runs/<run_id>: filters, newest first, cursors, indexes."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as api_exceptions

from models import RunRecord
from tests import job_targets
from tests.support.deliveries import JOBS, scheduler_headers


@pytest.fixture
def populated(make_client, clock):
    """Eight runs of three kinds, one clock-second apart (created ascending)."""
    client = make_client(JOBS)
    ids = []

    def remember(response):
        ids.append(response.json["run_id"])

    for minute in range(3):
        remember(
            client.post(
                "/jobs/invoice", headers=scheduler_headers(schedule_time=f"2026-01-01T00:0{minute}:00Z"), status=200
            )
        )
        clock.advance(1)
    job_targets.FAILURES["flaky"] = ["permanent"]
    remember(client.post("/jobs/flaky", headers=scheduler_headers(scheduler_job_name="flaky-job"), status=422))
    clock.advance(1)
    for token in ("m-1", "m-2"):
        remember(client.post_json("/api/v1/jobs/invoice/runs", {"clientToken": token}, status=201))
        clock.advance(1)
    remember(client.post_json("/api/v1/jobs/values/runs", {"parameters": {"value": 0}}, status=201))
    clock.advance(1)
    remember(
        client.post(
            "/jobs/values", b'{"value": []}', headers=scheduler_headers(scheduler_job_name="values-job"), status=200
        )
    )
    clock.advance(1)
    return client, ids


def listing(client, **params):
    return client.get("/api/v1/runs", params=params, status=200).json


def test_runs_are_listed_newest_first(populated):
    client, ids = populated
    runs = listing(client)["runs"]
    assert [r["run_id"] for r in runs] == list(reversed(ids))
    assert runs[-1]["job_id"] == "invoice" and runs[-1]["status"] == "completed"


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"job": "invoice"}, [5, 4, 2, 1, 0]),
        ({"status": "failed"}, [3]),
        ({"source": "api"}, [6, 5, 4]),
        ({"source": "scheduler", "job": "values"}, [7]),
        ({"job": "invoice", "source": "scheduler", "status": "completed"}, [2, 1, 0]),
        ({"since": "2030-01-01T00:00:02Z"}, [7, 6, 5, 4, 3, 2]),
        ({"until": "2030-01-01T00:00:02Z"}, [1, 0]),
        ({"job": "invoice", "since": "2030-01-01T00:00:01Z", "until": "2030-01-01T00:00:05Z"}, [4, 2, 1]),
    ],
)
def test_filters(populated, params, expected):
    client, ids = populated
    assert [r["run_id"] for r in listing(client, **params)["runs"]] == [ids[i] for i in expected]


def test_cursor_pagination_visits_every_run_once(populated):
    client, ids = populated
    seen, cursor, pages = [], None, 0
    while True:
        page = listing(client, limit=3, **({"cursor": cursor} if cursor else {}))
        seen += [r["run_id"] for r in page["runs"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids)) and pages == 3


@pytest.mark.parametrize(
    "params, words",
    [
        ({"limit": "101"}, "1 to 100"),
        ({"limit": "0"}, "1 to 100"),
        ({"limit": "ten"}, "integer"),
        ({"status": "done"}, "status"),
        ({"source": "cron"}, "source"),
        ({"since": "yesterday"}, "RFC 3339"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"job": "j" * 1501}, "job filter is longer than 1500 bytes"),
    ],
)
def test_bad_parameters_are_400(make_client, params, words):
    client = make_client(JOBS)  # refused before any query: no runs needed
    response = client.get("/api/v1/runs", params=params, status=400)
    assert words in response.json["message"]


def test_the_dashboard_refuses_a_job_filter_datastore_cannot_compare(populated):
    client, _ = populated
    assert "1500 bytes" in client.get("/admin/", params={"job": "é" * 751}, status=400).text
    client.get("/admin/", params={"job": "é" * 750}, status=404)  # comparable: only no such job


def test_one_run_in_full(populated):
    client, ids = populated
    failed = client.get(f"/api/v1/runs/{ids[3]}", status=200).json
    assert failed["status"] == "failed" and failed["error"]["message"] == "the invoice was rejected"
    manual = client.get(f"/api/v1/runs/{ids[6]}", status=200).json
    assert (
        manual["source"] == "api"
        and manual["parameters"] == {"value": 0}
        and manual["result"] == 0  # a manual run keeps its job's result, as a scheduled run does
        and "response" not in manual
    )
    assert manual["client_token"]
    client.get("/api/v1/runs/" + "f" * 64, status=404)
    client.get("/api/v1/runs/not-a-run-id", status=404)


def test_expired_runs_are_gone_from_the_api(populated, clock):
    client, ids = populated
    clock.advance(8 * 24 * 3600)
    assert listing(client)["runs"] == []
    client.get(f"/api/v1/runs/{ids[0]}", status=404)


def test_a_query_without_its_index_fails(ndb_context):
    # The emulator runs with --require_indexes against index.yaml: this query has no index.
    with pytest.raises(api_exceptions.FailedPrecondition, match="composite index"):
        RunRecord.query(RunRecord.job_id == "x").order(-RunRecord.expire_at).fetch(1, retries=0)


def test_pages_are_filled_past_expired_records(make_client, clock):
    client = make_client(JOBS)
    for minute in range(3):
        client.post(
            "/jobs/invoice", headers=scheduler_headers(schedule_time=f"2026-02-01T00:0{minute}:00Z"), status=200
        )
        clock.advance(1)
    for token in ("a", "b", "c", "d"):
        client.post_json("/api/v1/jobs/invoice/runs", {"clientToken": token}, status=201)
        clock.advance(1)
    clock.advance(2 * 3600)  # the manual runs (newest) have expired; the scheduled ones have not
    page = listing(client, limit=2)
    assert len(page["runs"]) == 2 and all(r["source"] == "scheduler" for r in page["runs"])
    assert len(listing(client, limit=2, cursor=page["next_cursor"])["runs"]) == 1


# Only 64 lower-case hex digits are ever looked up: reserved Datastore names, other
# lengths, other alphabets and encodings are 404 without a Datastore call.
NOT_RUN_IDS = [
    "__x__",
    "__" + "a" * 60 + "__",
    "A" * 64,
    "f" * 63,
    "f" * 65,
    "g" * 64,
    "\uff10" * 64,
    "\u0660" * 64,
    " " + "f" * 63,
    "f" * 63 + "%0a",
    "f" * 64 + "%0a",
    "%00" * 64,
    "..",
    "%2e%2e",
]


@pytest.mark.parametrize("run_id", NOT_RUN_IDS)
@pytest.mark.parametrize("prefix", ["/api/v1/runs/", "/admin/runs/"])
def test_anything_but_a_run_id_is_404_without_a_lookup(datastore, jobs_file, clock, prefix, run_id):
    import webtest

    from devtools.rpc_counter import counting_client
    from handlers import create_app

    ndb_client, counter = counting_client(datastore.project)
    app = webtest.TestApp(create_app(jobs_file=jobs_file(JOBS), clock=clock, ndb_client=ndb_client))
    import urllib.parse

    response = app.get(prefix + urllib.parse.quote(run_id, safe="%._"), status=404)
    assert response.content_type == "application/problem+json"
    assert counter.total == 0
