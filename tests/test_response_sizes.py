"""What a caller stores cannot blow up a reader: the worst-case size of each read route.

Records are written at every input limit at once (parameters of 256 KiB as
stored, results of 512 KiB, the longest ids, tokens, scope and downstream
name, previews of characters that escape the most), then each read route is
measured.  The bounds are the ones docs/limits.md states; ``pytest -s`` prints
the measured sizes beside them.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from dedup.adapters.flask_guard import MAX_KEPT_BODY_BYTES, MAX_STORED_PARAMETER_BYTES, _check_fingerprintable
from dedup.claims import MAX_ATTEMPT_HISTORY
from dedup.keys import scheduled_run_key
from dedup.ledger import Ledger, RunDescription, RunPolicy
from dedup.runner import MAX_STORED_JSON_BYTES, storable_json_problem
from dedup.stored_response import StoredResponse
from jobs.base import MAX_DOWNSTREAM_CHARS

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS_DOC = "docs/limits.md"
ASTRAL = "\U0001f600"  # 12 bytes as JSON (a surrogate pair of \\u escapes)
JOB_ID = "a-job-id-of-the-longest-kind-allowed-in-jobs-yaml-which-is-one-hundred-characters-long-xxxxxxxxxxxxx"
OTHER_JOB_ID = JOB_ID[:-1] + "y"
JOBS = f"""
jobs:
  {JOB_ID}:
    kind: python
    target: tests.job_targets:record
"""
TWO_JOBS = (
    JOBS
    + f"""
  {OTHER_JOB_ID}:
    kind: python
    target: tests.job_targets:record
"""
)


# The longest principal name an email allows (254 characters), of the characters that escape worst.
LONGEST_PRINCIPAL = "serviceAccount:" + '"' * (254 - len("@p.iam.gserviceaccount.com")) + "@p.iam.gserviceaccount.com"


def documented_bounds() -> dict[str, int]:
    """The table of docs/limits.md: rows ``| `GET route` | what it holds | N KiB |``."""
    with open(os.path.join(ROOT, LIMITS_DOC), encoding="utf-8") as handle:
        text = handle.read()
    rows = re.finditer(r"^\| `(GET [^`]+)` \|.*\| (\d+) KiB \|$", text, re.MULTILINE)
    return {row[1]: int(row[2]) * 1024 for row in rows}


def largest_parameters() -> dict:
    """Parameters just inside the limit, measured as stored (each "щ" is 6 bytes escaped)."""
    parameters = {"text": "щ" * ((MAX_STORED_PARAMETER_BYTES - len('{"text":""}')) // 6)}
    _check_fingerprintable(parameters)  # accepted
    return parameters


def largest_result() -> list:
    """A result just inside the runner's limit, of the characters that escape the most."""
    result = [ASTRAL * ((MAX_STORED_JSON_BYTES - 4) // 12)]
    assert storable_json_problem(result) is None
    return result


def ampersands() -> tuple[dict, list]:
    """Parameters and a result of the character that grows most as HTML (``&`` is ``&amp;``)."""
    parameters = {"text": "&" * (MAX_STORED_PARAMETER_BYTES - len('{"text":""}'))}
    _check_fingerprintable(parameters)
    result = ["&" * (MAX_STORED_JSON_BYTES - 4)]
    assert storable_json_problem(result) is None
    return parameters, result


def kept_response_of_growing_numbers() -> dict:
    """A guard's kept JSON response whose numbers would grow if parsed and re-encoded (1E15)."""
    body = "[" + ",".join(["1E15"] * ((MAX_KEPT_BODY_BYTES - 2) // 5)) + "]"
    document = StoredResponse.from_body(201, body.encode(), {"Content-Type": "application/json"}).document()
    assert storable_json_problem(document) is None
    return document


def write_worst_records(
    ndb_client,
    clock,
    count: int,
    job_id: str = JOB_ID,
    finish: bool = True,
    first: int = 0,
    parameters: dict | None = None,
    result=None,
) -> list[str]:
    ledger = Ledger(clock)
    policy = RunPolicy(lease_seconds=5 if finish else 3600, retention_seconds=7 * 24 * 3600)
    parameters = parameters if parameters is not None else largest_parameters()
    result = result if result is not None else largest_result()
    run_ids = []
    with ndb_client.context():
        for number in range(first, first + count):
            key = scheduled_run_key(
                "s" * 500, "2030-01-01T00:00:00Z", query_project="e" * 63 + ":" + "p" * 30, query_location="l" * 63
            )
            run_id = key.run_id[:-6] + f"{number:06x}"
            description = RunDescription(
                source="guard",
                job_id=job_id,
                scheduler_job_name=key.scheduler_job_name,
                schedule_time=key.schedule_time,
                project=key.project,
                location=key.location,
                client_token='"' * 255,
                scope="x" * 100,
                parameters=parameters,
                fingerprint="f" * 64,
                requested_by=LONGEST_PRINCIPAL,
            )
            claimed = None
            # The first run has a full attempt history: every attempt but the last taken over.
            for _ in range(MAX_ATTEMPT_HISTORY if number == 0 else 1):
                claimed = ledger.claim_run(run_id, description, policy)
                ledger.record_downstream(claimed.attempt, '"' * MAX_DOWNSTREAM_CHARS)
                if finish:
                    clock.advance(6)
            if finish:
                ledger.complete_run(claimed.attempt, result, policy)
            run_ids.append(run_id)
    return run_ids


@pytest.fixture
def worst(make_client, ndb_client, clock):
    client = make_client(JOBS)
    run_ids = write_worst_records(ndb_client, clock, 100)
    return client, run_ids


def test_each_read_route_stays_within_its_documented_size(worst, make_client, ndb_client, clock):
    client, run_ids = worst
    bounds = documented_bounds()
    measured = {
        "GET /api/v1/runs?limit=100": len(client.get("/api/v1/runs?limit=100", status=200).body),
        "GET /admin/": len(client.get("/admin/", status=200).body),
    }
    # Single records of the other worst kinds: HTML-heavy text, a kept response.
    amp_parameters, amp_result = ampersands()
    (amp,) = write_worst_records(ndb_client, clock, 1, first=2000, parameters=amp_parameters, result=amp_result)
    (kept,) = write_worst_records(ndb_client, clock, 1, first=3000, result=kept_response_of_growing_numbers())
    singles = [run_ids[0], amp, kept]
    for route in ("/api/v1/runs/", "/admin/runs/"):
        measured[f"GET {route}<run_id>"] = max(len(client.get(route + run_id, status=200).body) for run_id in singles)
    # A further job adds its card: its 5 newest runs and up to 50 in progress.
    two = make_client(TWO_JOBS)
    write_worst_records(ndb_client, clock, 50, OTHER_JOB_ID, finish=False, first=1000)
    with_other = len(two.get("/admin/", status=200).body)
    measured["GET /admin/ (each further job)"] = with_other - measured["GET /admin/"]
    for route, size in measured.items():
        print(f"{route:32} {size / 1024:8.1f} KiB (bound {bounds[route] / 1024:.0f} KiB)")
    assert set(measured) == set(bounds), f"{LIMITS_DOC} and this test must list the same routes"
    for route, size in measured.items():
        assert size <= bounds[route], f"{route}: {size} bytes, over the {bounds[route]} {LIMITS_DOC} states"


def test_a_list_summarises_and_the_single_run_is_whole(worst, ndb_client, clock):
    client, run_ids = worst
    listed = client.get("/api/v1/runs?limit=100", status=200).json["runs"]
    assert len(listed) == 100
    for summary in listed:
        assert not {"parameters", "result", "error", "response", "attempts"} & set(summary)
        assert len(summary["preview"]) == 200 and summary["preview"].endswith("…")
    assert {summary["run_id"]: summary["takeovers"] for summary in listed}[run_ids[0]] == MAX_ATTEMPT_HISTORY - 1
    whole = client.get(f"/api/v1/runs/{run_ids[0]}", status=200).json
    assert whole["parameters"] == largest_parameters()
    assert len(whole["attempts"]) == MAX_ATTEMPT_HISTORY
    assert "response" in whole or "result" in whole
    # The kept response is answered as text: parsed and re-encoded it would grow fivefold.
    (kept,) = write_worst_records(ndb_client, clock, 1, first=3000, result=kept_response_of_growing_numbers())
    body = json.loads(client.get(f"/api/v1/runs/{kept}", status=200).text, parse_constant=_not_json)
    assert isinstance(body["response"]["body"], str) and body["response"]["body"].startswith("[1E15,")


def _not_json(name: str):
    raise AssertionError(f"{name} is not JSON")


def test_summaries_never_decode_parameters_or_results(datastore, ndb_client, clock):
    """NDB decodes a property when it is first read: a summary must read neither."""
    from google.cloud.ndb import model

    from handlers.run_documents import run_summary
    from models import RunRecord

    write_worst_records(ndb_client, clock, 3)
    with ndb_client.context():
        for record in RunRecord.query().fetch():
            run_summary(record, clock.now())
            for name in ("parameters", "result", "error"):
                stored = record._values.get(name)
                assert stored is None or isinstance(stored, model._BaseValue), f"{name} was decoded"


def test_a_record_written_before_previews_gets_one_made_from_its_result(make_client, ndb_client, clock):
    from models import RunRecord

    client = make_client(JOBS)
    (run_id,) = write_worst_records(ndb_client, clock, 1)
    with ndb_client.context():
        record = RunRecord.get_by_id(run_id)
        expected, record.preview = record.preview, None
        record.put()
    (summary,) = client.get("/api/v1/runs", status=200).json["runs"]
    assert summary["preview"] == expected and expected.startswith('["' + ASTRAL)
