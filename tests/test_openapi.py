"""handlers/openapi.yaml describes /api/v1 as the app answers it: real requests to the app on
gunicorn, each request and answer checked against the description (openapi-core), for every
route and its main statuses.

The description names no ``default`` answer, and its documents no field they do not list, so an
answer with a status or a field it does not name fails here; a route of the app it does not
describe, or one it describes that the app does not serve, fails too.
"""

from __future__ import annotations

import datetime
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from openapi_core import Config, OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse

from dedup.keys import format_utc
from devtools.gunicorn import GunicornServer
from tests.support.deliveries import a_day_ago
from tests.support.live import serving

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILE = ROOT / "handlers" / "openapi.yaml"
RETENTION = 1200  # slots older than this are unknown (tests/test_slot_decisions_live.py)
JOBS = f"""
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 15
    retention_seconds: {RETENTION}
  refuse:
    kind: python
    target: tests.job_targets:refuse
  long:
    kind: python
    target: tests.job_targets:file_gate
    lease_seconds: 60
"""


def scheduler_yaml(effects: Path) -> str:
    every_minute = """
        schedule: "* * * * *"
        project: acme-prod
        location: us-central1
        attempt_deadline: 15s
        retry: {retry_count: 0}
        start_at: """ + a_day_ago()
    return textwrap.dedent(f"""
    jobs:
      effect-every-minute:
        target: effect{every_minute}
        body: '{json.dumps({"dir": str(effects)})}'
      refuse-every-minute:
        target: refuse{every_minute}
    """)


@pytest.fixture(scope="module")
def spec() -> OpenAPI:
    # The description is itself checked (OpenAPI 3.1); problems are JSON (RFC 9457).
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_file_path(str(SPEC_FILE), config=config)


@pytest.fixture(scope="module")
def effects(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("effects")


@pytest.fixture(scope="module")
def server(emulator, tmp_path_factory, effects) -> Iterator[GunicornServer]:
    folder = tmp_path_factory.mktemp("openapi")
    (folder / "scheduler.yaml").write_text(scheduler_yaml(effects))
    with serving(emulator, folder, JOBS, workers=1, threads=4, quiet=True) as running:
        yield running


class Checked:
    """Requests to the app, each checked against the description; what was seen, by route and status."""

    def __init__(self, spec: OpenAPI, base: str) -> None:
        self.spec, self.base = spec, base
        self.seen: set[tuple[str, str, int]] = set()

    def __call__(self, method: str, path: str, *, out_of_spec: bool = False, **options: Any) -> requests.Response:
        """The answer, checked; the request too, unless it is meant to be one the description refuses."""
        response = requests.request(method, self.base + path, timeout=60, allow_redirects=False, **options)
        request = RequestsOpenAPIRequest(response.request)
        if not out_of_spec:
            self.spec.validate_request(request)
        self.spec.validate_response(request, RequestsOpenAPIResponse(response))
        template = self.spec.spec / "paths"
        self.seen.add((method, _template(path, [str(t) for t in template.keys()]), response.status_code))
        return response


def _template(path: str, templates: list[str]) -> str:
    path = path.split("?")[0]
    for template in templates:
        parts, wanted = template.split("/"), path.split("/")
        if len(parts) == len(wanted) and all(p.startswith("{") or p == w for p, w in zip(parts, wanted, strict=True)):
            return template
    raise AssertionError(f"{path} is in no path of the description")


@pytest.fixture
def api(spec, server, datastore) -> Checked:
    return Checked(spec, server.url)


def minute(minutes_ago: int) -> str:
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    return format_utc(now - datetime.timedelta(minutes=minutes_ago))


SLOT = "/api/v1/jobs/{job}/executions/{time}/run?scheduler_job={job}-every-minute"
MANUAL = "/api/v1/jobs/{job_id}/runs"
JSON = {"Content-Type": "application/json"}


def test_the_description_covers_every_api_route_of_the_app_and_no_other(make_client, spec):
    app = make_client(JOBS).app
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/api/v1/"):
            path = rule.rule.replace("<", "{").replace(">", "}")
            served |= {(path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    described = {
        (str(path), str(method))
        for path, operations in (spec.spec / "paths").items()
        for method in operations.keys()
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert described == served


@pytest.mark.live
def test_manual_runs_answer_as_described(api, effects, tmp_path):
    body = {"clientToken": "openapi-1", "parameters": {"dir": str(effects)}}
    assert api("POST", MANUAL.format(job_id="effect"), json=body).status_code == 201
    replayed = api("POST", MANUAL.format(job_id="effect"), json=body)
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    other = {**body, "parameters": {"dir": str(effects), "x": "1"}}
    assert api("POST", MANUAL.format(job_id="effect"), json=other).json()["error"] == "ConflictException"
    assert api("POST", MANUAL.format(job_id="refuse"), json={"clientToken": "f-1"}).json()["status"] == "failed"
    assert api("POST", MANUAL.format(job_id="long"), json={"clientToken": "crash-1"}).status_code == 500  # no gate
    assert (
        api("POST", MANUAL.format(job_id="effect"), json={"clientToken": "bad token"}, out_of_spec=True).status_code
        == 400
    )
    assert api("POST", MANUAL.format(job_id="nope"), json={}).status_code == 404
    assert (
        api(
            "POST", MANUAL.format(job_id="effect"), data="x", headers={"Content-Type": "text/plain"}, out_of_spec=True
        ).status_code
        == 415
    )
    assert (
        api(
            "POST", MANUAL.format(job_id="effect"), data=b"0" * (1 << 20 | 1), headers=JSON, out_of_spec=True
        ).status_code
        == 413
    )

    gate = tmp_path / "gate"
    holder = {"clientToken": "in-flight", "parameters": {"gate_file": str(gate)}}
    first = threading.Thread(target=lambda: api("POST", MANUAL.format(job_id="long"), json=holder))
    first.start()
    try:
        for _ in range(200):
            if requests.get(f"{api.base}/api/v1/runs?job=long&status=in_progress", timeout=10).json()["runs"]:
                break
            time.sleep(0.05)
        busy = api("POST", MANUAL.format(job_id="long"), json=holder)
        assert busy.status_code == 409 and busy.json()["error"] == "RunInProgress"
    finally:
        gate.touch()
        first.join(30)
    statuses = {status for method, path, status in api.seen if path == MANUAL}
    assert statuses == {200, 201, 400, 404, 409, 413, 415, 422, 500}


@pytest.mark.live
def test_the_run_api_answers_as_described(api, effects):
    run = api("POST", MANUAL.format(job_id="effect"), json={"parameters": {"dir": str(effects)}}).json()
    api("POST", MANUAL.format(job_id="refuse"), json={})
    api("POST", SLOT.format(job="effect", time=minute(3)))  # a Scheduler run among them
    listed = api("GET", "/api/v1/runs?limit=10").json()
    assert {r["status"] for r in listed["runs"]} == {"completed", "failed"} and len(listed["runs"]) == 3
    assert len(api("GET", "/api/v1/runs?job=effect&status=completed&source=api").json()["runs"]) == 1
    assert api("GET", "/api/v1/runs?limit=1").json()["next_cursor"]
    assert api("GET", "/api/v1/runs?limit=500", out_of_spec=True).status_code == 400
    assert api("GET", "/api/v1/runs?cursor=nonsense").status_code == 400
    for summary in listed["runs"]:
        assert api("GET", f"/api/v1/runs/{summary['run_id']}").json()["run_id"] == summary["run_id"]
    assert api("GET", f"/api/v1/runs/{run['run_id']}").json()["attempts"][0]["attempt"] == 1
    assert api("GET", "/api/v1/runs/" + "f" * 64).status_code == 404
    described = api("GET", "/api/v1/openapi.yaml")
    assert yaml.safe_load(described.text) == yaml.safe_load(SPEC_FILE.read_text())
    assert {(path, status) for _, path, status in api.seen if path.startswith("/api/v1/runs")} >= {
        ("/api/v1/runs", 200),
        ("/api/v1/runs", 400),
        ("/api/v1/runs/{run_id}", 200),
        ("/api/v1/runs/{run_id}", 404),
    }


@pytest.mark.live
def test_executions_and_slot_runs_answer_as_described(api, effects):
    executions = "/api/v1/jobs/effect/executions"
    done = api("POST", SLOT.format(job="effect", time=minute(5)))
    assert done.status_code == 200 and done.json()["duplicate"] is False
    again = api("POST", SLOT.format(job="effect", time=minute(5)))
    assert again.json()["duplicate"] is True and again.headers["X-Dedup-Run-Id"] == done.json()["run_id"]
    failed = api("POST", SLOT.format(job="refuse", time=minute(5)))
    assert failed.status_code == 422 and failed.json()["status"] == "failed"
    unreopened = api("POST", SLOT.format(job="refuse", time=minute(5)))
    assert unreopened.status_code == 428 and unreopened.json()["attempt"] == 1
    assert api("POST", SLOT.format(job="refuse", time=minute(5)) + "&attempt=1").json()["attempt"] == 2
    old = minute(RETENTION // 60 + 10)
    unknown = api("POST", SLOT.format(job="effect", time=old))
    assert unknown.status_code == 422 and unknown.json()["error"] == "ExecutionUnknown"
    assert api("POST", SLOT.format(job="effect", time=old) + "&force=true").status_code == 200
    assert api("POST", SLOT.format(job="effect", time=minute(5)) + "&attempt=x", out_of_spec=True).status_code == 400
    assert api("POST", SLOT.format(job="effect", time=minute(5).replace(":00.", ":30."))).status_code == 404

    api("POST", MANUAL.format(job_id="effect"), json={"parameters": {"dir": str(effects)}})  # unscheduled
    page = api("GET", f"{executions}?since={minute(RETENTION // 60 + 15)}").json()
    assert {e["status"] for e in page["executions"]} >= {"completed", "missed", "unknown"}
    assert len(page["unscheduled"]) == 1
    assert api("GET", f"{executions}?since=2026-11-29T00:00:00Z&until=2026-11-28T00:00:00Z").status_code == 400
    assert api("GET", "/api/v1/jobs/nope/executions").status_code == 404
    seen = {(path.rsplit("/", 1)[-1], status) for _, path, status in api.seen if "executions" in path}
    assert seen == {("run", s) for s in (200, 400, 404, 422, 428)} | {("executions", s) for s in (200, 400, 404)}


def test_no_route_is_described_with_a_default_answer_or_a_503(spec):
    """No ``default``: an answer the description does not name fails the tests above.  No 503:
    Cloud Scheduler retries an App Engine target's 503 without bound (README.md)."""
    for path, operations in (spec.spec / "paths").items():
        for method, operation in operations.items():
            statuses = [str(code) for code in (operation / "responses").keys()]
            assert "default" not in statuses and "503" not in statuses, (path, method)
