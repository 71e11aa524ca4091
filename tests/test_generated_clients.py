"""Clients generated from the description the app serves work against the app (issue 40, §3).

openapi-python-client and openapi-typescript each take ``/api/v1/openapi.yaml`` with no warning:
no schema or answer dropped.  The commands are docs/dedupctl.md's ("Generating a client"), run as
printed there, in a folder of the test's own.  The Python client is imported from that folder and
calls every operation of the app on gunicorn, for every answer the description documents, errors
included: ``raise_on_unexpected_status`` makes an undocumented status raise, openapi-core checks
each answer against the description, and each answer must parse to its own class, in the media
type that class comes in.  The TypeScript types check a typed call (tests/clients/typescript/
call.ts) with tsc: a run's ``parameters``, and the headers the answers carry.
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import yaml
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

from dedup.idempotency import KEY_VERSION
from dedup.keys import digest_parts, format_utc
from devtools.gunicorn import GunicornServer
from models import RunRecord
from service.runs import MANUAL_RUN_NAMESPACE
from tests.support.callers import issuer  # noqa: F401 - a fixture
from tests.support.deliveries import a_day_ago
from tests.support.live import serving

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILE = ROOT / "handlers" / "openapi.yaml"
GUIDE = ROOT / "docs" / "dedupctl.md"
HEADING = "## Generating a client"
TYPESCRIPT = ROOT / "tests" / "clients" / "typescript"
PACKAGE = "dedup_api"  # the docs' --output-path

AUDIENCE = "https://dedup.example.com"
OPERATOR = "ci@acme-prod.iam.gserviceaccount.com"
VIEWER = "reader@acme-prod.iam.gserviceaccount.com"
STRANGER = "intruder@acme-prod.iam.gserviceaccount.com"  # verified, and holds no role
SCHEDULER = "scheduler-invoker@acme-prod.iam.gserviceaccount.com"  # delivers (DEDUP_OIDC_ALLOWED_EMAILS)
QUEUE = "projects/acme-prod/locations/us-central1/queues/dedup-dispatch"
HANDLER = "http://127.0.0.1:9/tasks/nightly-report"  # the external job's handler: only queued to, never called
RETENTION = 1200  # seconds: effect's slots older than this are unknown
JOBS = f"""
jobs:
  effect:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 15
    retention_seconds: {RETENTION}
  sleepy:
    kind: python
    target: tests.job_targets:file_effect
    lease_seconds: 15
  refuse:
    kind: python
    target: tests.job_targets:refuse
  long:
    kind: python
    target: tests.job_targets:file_gate
    lease_seconds: 60
  reports:
    kind: external
    url: {HANDLER}
    service_account: {SCHEDULER}
    lease_seconds: 60
"""
RECORDS = {"ManualRun", "RunAnswer"}  # what comes as application/json; every other error is a problem
DESCRIPTION: dict[str, Any] = yaml.safe_load(SPEC_FILE.read_text(encoding="utf-8"))
OPERATIONS = {  # (method, path template): the operation
    (method, path): operation
    for path, operations in DESCRIPTION["paths"].items()
    for method, operation in operations.items()
}


def scheduler_yaml(effects: Path) -> str:
    """A Scheduler job a minute for each job; sleepy's slots take 3 s (a slot run in progress)."""
    every_minute = f"""
        schedule: "* * * * *"
        project: acme-prod
        location: us-central1
        attempt_deadline: 15s
        retry: {{retry_count: 0}}
        start_at: {a_day_ago()}"""
    return textwrap.dedent(f"""
    jobs:
      effect-every-minute:
        target: effect{every_minute}
        body: '{json.dumps({"dir": str(effects)})}'
      sleepy-every-minute:
        target: sleepy{every_minute}
        body: '{json.dumps({"dir": str(effects), "sleep": 3})}'
      refuse-every-minute:
        target: refuse{every_minute}
      long-every-minute:
        target: long{every_minute}
      reports-every-minute:
        target: reports{every_minute}
    """)


def documented_blocks() -> list[str]:
    """The shell blocks of the guide's section, in order: fetch, the Python client, the TypeScript types."""
    section = GUIDE.read_text(encoding="utf-8").partition(f"\n{HEADING}\n")[2].partition("\n## ")[0]
    return re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)


def run_documented(block: str, folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A block of the guide run as printed, by bash, in ``folder``; stdout and stderr together."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=folder,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("effects")


@pytest.fixture(scope="module")
def server(
    emulator: Any,
    google_fakes: Any,
    _cloud_tasks_fake: Any,
    issuer: Any,
    tmp_path_factory: pytest.TempPathFactory,
    effects: Path,
) -> Iterator[GunicornServer]:
    """The app as deployed behind ID tokens (oidc), with the Cloud Scheduler and Cloud Tasks stand-ins."""
    folder = tmp_path_factory.mktemp("clients")
    (folder / "scheduler.yaml").write_text(scheduler_yaml(effects))
    environ = {
        "DEDUP_AUTH": "oidc",
        "DEDUP_OIDC_AUDIENCE": AUDIENCE,
        "DEDUP_OIDC_ALLOWED_EMAILS": SCHEDULER,
        "DEDUP_OIDC_CERTS_URL": issuer.certs_url,
        "DEDUP_OPERATORS": f"serviceAccount:{OPERATOR}",
        "DEDUP_VIEWERS": f"serviceAccount:{VIEWER}",
        "DEDUP_SCHEDULER_API_BASE": google_fakes.url,
        "DEDUP_TASKS_QUEUE": QUEUE,
        "DEDUP_TASKS_API_BASE": _cloud_tasks_fake.url,
        "DEDUP_TASKS_TRANSPORT": "rest",  # the stand-in speaks REST
    }
    with serving(emulator, folder, JOBS, workers=1, threads=4, quiet=True, extra_env=environ) as running:
        yield running


@pytest.fixture(scope="module")
def tokens(issuer: Any) -> dict[str, str]:
    """An ID token for the app's audience of each caller (an hour: longer than the module runs)."""
    callers = {"operator": OPERATOR, "viewer": VIEWER, "stranger": STRANGER, "scheduler": SCHEDULER}
    return {who: issuer.token(audience=AUDIENCE, email=email) for who, email in callers.items()}


@pytest.fixture(scope="module")
def fetched(server: GunicornServer, tokens: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with openapi.yaml, fetched from the app by the guide's command: the file it serves."""
    folder = tmp_path_factory.mktemp("generated")
    fetch = documented_blocks()[0]
    done = run_documented(fetch, folder, TOKEN=tokens["viewer"], DEDUP_URL=server.url)
    assert done.returncode == 0, done.stdout
    assert (folder / "openapi.yaml").read_bytes() == SPEC_FILE.read_bytes()
    return folder


@pytest.fixture(scope="module")
def generated(fetched: Path) -> Iterator[tuple[types.ModuleType, str]]:
    """The Python client, generated by the guide's command and imported from its folder; what the
    generator said.  The venv's bin first on PATH: the generator formats its output with ruff."""
    done = run_documented(documented_blocks()[1], fetched, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stdout
    sys.path.insert(0, str(fetched))
    try:
        yield importlib.import_module(PACKAGE), done.stdout
    finally:
        sys.path.remove(str(fetched))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def spec() -> OpenAPI:
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_file_path(str(SPEC_FILE), config=config)


def operation_id_of(method: str, path: str) -> str:
    """The operationId of the description's operation that serves ``path``."""
    for (described_method, template), operation in OPERATIONS.items():
        pattern = re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template))
        if described_method == method and re.fullmatch(pattern, path):
            return str(operation["operationId"])
    raise AssertionError(f"{method.upper()} {path} is in no path of the description")


def documented() -> dict[str, set[int]]:
    """Every operation's documented statuses, by operationId."""
    return {operation["operationId"]: {int(s) for s in operation["responses"]} for operation in OPERATIONS.values()}


class _Request:
    """An httpx request as openapi-core reads one (its requests adapter's, for httpx)."""

    def __init__(self, request: httpx.Request) -> None:
        self.request = request
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(list(request.url.params.multi_items())),
            header=Headers(list(request.headers.multi_items())),
            cookie=ImmutableMultiDict(),
        )
        self.host_url = f"{request.url.scheme}://{request.url.netloc.decode()}"
        self.path = request.url.path
        self.method = request.method.lower()
        self.body = request.content
        self.content_type = request.headers.get("Content-Type", "")


class _Response:
    """An httpx response as openapi-core reads one."""

    def __init__(self, response: httpx.Response) -> None:
        self.data = response.content
        self.status_code = response.status_code
        self.content_type = response.headers.get("Content-Type", "")
        self.headers = Headers(list(response.headers.multi_items()))


class Calls:
    """The generated client's operations as each caller calls them; every answer checked against
    the description (openapi-core), and each operation's statuses seen recorded."""

    def __init__(self, package: types.ModuleType, spec: OpenAPI, base_url: str, tokens: dict[str, str]) -> None:
        self.package, self.spec, self.base_url, self.tokens = package, spec, base_url, tokens
        self.models = importlib.import_module(f"{PACKAGE}.models")
        self.seen: dict[str, set[int]] = {}
        self.made: list[Any] = []

    def op(self, name: str) -> Any:
        """The module of an operation (its sync_detailed), by its operationId in snake case."""
        return importlib.import_module(f"{PACKAGE}.api.default.{re.sub(r'(?<!^)(?=[A-Z])', '_', name).lower()}")

    def _check(self, response: httpx.Response) -> None:
        response.read()
        self.spec.validate_response(_Request(response.request), _Response(response))
        operation = operation_id_of(response.request.method.lower(), response.request.url.path)
        self.seen.setdefault(operation, set()).add(response.status_code)

    def client(self, who: str | None = "operator", before: Callable[[httpx.Request], None] | None = None) -> Any:
        """A client with ``who``'s token (None: no credentials); ``before`` changes each request as sent."""
        hooks: dict[str, list[Callable[..., None]]] = {"response": [self._check]}
        if before is not None:
            hooks["request"] = [before]
        options = {"base_url": self.base_url, "raise_on_unexpected_status": True, "timeout": httpx.Timeout(60)}
        options["httpx_args"] = {"event_hooks": hooks}
        if who is None:
            made = self.package.Client(**options)
        else:
            made = self.package.AuthenticatedClient(token=self.tokens[who], **options)
        self.made.append(made)
        return made

    def close(self) -> None:
        """Close every client's connections (a socket left open warns, and warnings are errors)."""
        for made in self.made:
            made.get_httpx_client().close()


def expect(response: Any, status: int, kind: str) -> Any:
    """The parsed answer, after checking its status, its class and the media type it came in."""
    assert response.status_code == status, (response.status_code, response.content[:1000])
    assert type(response.parsed).__name__ == kind, (kind, response.parsed)
    if status >= 400:
        media = response.headers["Content-Type"].split(";")[0]
        assert media == ("application/json" if kind in RECORDS else "application/problem+json"), (kind, media)
    return response.parsed


def minute(minutes_ago: int) -> str:
    now = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0)
    return format_utc(now - datetime.timedelta(minutes=minutes_ago))


def text_plain(request: httpx.Request) -> None:
    """A body sent as text, not JSON: the generated client always says application/json."""
    request.headers["Content-Type"] = "text/plain"


def twice(request: httpx.Request) -> None:
    """A query parameter given twice: a 400 on any route (handlers/request_limits.py)."""
    request.url = request.url.copy_with(query=b"view=full&view=full")


@pytest.fixture
def api(
    generated: tuple[types.ModuleType, str], spec: OpenAPI, server: GunicornServer, tokens, datastore
) -> Iterator[Calls]:
    calls = Calls(generated[0], spec, server.url, tokens)
    yield calls
    calls.close()


def test_the_python_client_is_generated_with_nothing_dropped(generated, spec):
    package, said = generated
    assert "arning" not in said and "Unable to" not in said and "omitted" not in said, said
    assert said.strip() == f"Generating {PACKAGE}", said  # and its formatter (ruff) ran
    calls = Calls(package, spec, "http://unused", {})
    for operation, statuses in documented().items():
        source = inspect.getsource(calls.op(operation))
        for status in statuses:
            assert f"if response.status_code == {status}:" in source, (operation, status)
    problems = ["Problem", "Busy", "ConflictException", "JobMismatch", "RetryableFailure", "ExecutionUnknown"]
    for name in [*problems, "PreconditionRequired", "RunsElsewhere", "ManualRun", "RunAnswer", "ResumeChange"]:
        assert hasattr(calls.models, name), name


def test_every_operation_answers_401_and_403_through_the_client(api):
    """No credentials: 401 with its challenge.  A verified caller without the role: 403.  A viewer
    who operates: 403, so each operation's documented 401 and 403 come as described."""
    models = api.models

    def every_operation(client: Any) -> dict[str, Any]:
        body = models.StartManualRunBody(client_token="auth-1")
        slot = {"scheduler_job": "effect-every-minute"}
        review = models.SettleStepBody(decision=models.SettleStepBodyDecision.DONE, attempt=1)
        return {
            "startManualRun": api.op("startManualRun").sync_detailed("effect", client=client, body=body),
            "listRuns": api.op("listRuns").sync_detailed(client=client),
            "getRun": api.op("getRun").sync_detailed("f" * 64, client=client),
            "listExecutions": api.op("listExecutions").sync_detailed("effect", client=client),
            "runSlot": api.op("runSlot").sync_detailed("effect", minute(5), client=client, **slot),
            "listSchedulerJobs": api.op("listSchedulerJobs").sync_detailed(client=client),
            "pauseSchedulerJob": api.op("pauseSchedulerJob").sync_detailed(
                "effect-every-minute", client=client, body=models.PauseSchedulerJobBody()
            ),
            "resumeSchedulerJob": api.op("resumeSchedulerJob").sync_detailed(
                "effect-every-minute", client=client, body=models.ResumeSchedulerJobBody()
            ),
            "settleStep": api.op("settleStep").sync_detailed("f" * 64, "charge", client=client, body=review),
            "getStatus": api.op("getStatus").sync_detailed(client=client),
            "getOpenApiDescription": api.op("getOpenApiDescription").sync_detailed(client=client),
        }

    for operation, answer in every_operation(api.client(None)).items():
        assert expect(answer, 401, "Problem").error == "Unauthenticated", operation
        assert answer.headers["WWW-Authenticate"].startswith("Bearer"), operation
    for operation, answer in every_operation(api.client("stranger")).items():
        assert expect(answer, 403, "Problem").error == "Forbidden", operation
    operating = {"startManualRun", "runSlot", "pauseSchedulerJob", "resumeSchedulerJob", "settleStep"}
    for operation, answer in every_operation(api.client("viewer")).items():
        if operation in operating:
            assert expect(answer, 403, "Problem").error == "Forbidden", operation
    assert set(api.seen) == set(documented())  # every operation was called
    assert all({401, 403} <= statuses for statuses in api.seen.values())


def test_manual_runs_answer_through_the_client_as_described(api, effects, tmp_path, ndb_client):
    run, models = api.op("startManualRun"), api.models
    client = api.client()

    def body(token: str | None, **parameters: Any) -> Any:
        unset = importlib.import_module(f"{PACKAGE}.types").UNSET
        given = models.StartManualRunBodyParameters()
        ask = models.StartManualRunBody(client_token=unset if token is None else token, parameters=given)
        ask.parameters.additional_properties.update(parameters)
        return ask

    first = run.sync_detailed("effect", client=client, body=body("gen-1", dir=str(effects), region="eu"))
    done = expect(first, 201, "ManualRun")
    assert done.status == "completed" and done.client_token == "gen-1" and done.requested_by.endswith(OPERATOR)
    assert first.headers["Idempotency-Key"] == "gen-1" and "Idempotency-Expires" in first.headers
    again = run.sync_detailed("effect", client=client, body=body("gen-1", dir=str(effects), region="eu"))
    assert expect(again, 200, "ManualRun").run_id == done.run_id and again.parsed.duplicate is True
    assert again.headers["Idempotent-Replayed"] == "true" and again.headers["Idempotency-Key"] == "gen-1"
    assert again.headers["Idempotency-Expires"] == first.headers["Idempotency-Expires"]
    by_header = run.sync_detailed("effect", client=client, body=body(None, dir=str(effects)), idempotency_key="gen-2")
    assert expect(by_header, 201, "ManualRun").client_token == "gen-2"

    # Every kind of 422, each its own class: the run's failure (then replayed), a conflict, another
    # job's run under the key, an external job.
    other = run.sync_detailed("effect", client=client, body=body("gen-1", dir=str(effects), region="us"))
    assert expect(other, 422, "ConflictException").differing == ["region"] and other.parsed.run_id == done.run_id
    assert "Idempotency-Expires" in other.headers
    failed = run.sync_detailed("refuse", client=client, body=body("gen-3"))
    assert expect(failed, 422, "ManualRun").status == "failed" and failed.parsed.error.message
    assert "Idempotent-Replayed" not in failed.headers
    failed_again = run.sync_detailed("refuse", client=client, body=body("gen-3"))
    assert expect(failed_again, 422, "ManualRun").duplicate is True
    assert failed_again.headers["Idempotent-Replayed"] == "true"
    seed_another_jobs_run(ndb_client, job_id="effect", token="gen-4", recorded_job_id="refuse")
    mismatch = run.sync_detailed("effect", client=client, body=body("gen-4"))
    assert expect(mismatch, 422, "JobMismatch").recorded_job_id == "refuse"
    elsewhere = run.sync_detailed("reports", client=client, body=body("gen-5"))
    assert expect(elsewhere, 422, "RunsElsewhere").url == HANDLER

    released = run.sync_detailed("long", client=client, body=body("gen-6"))  # no gate_file: it raises
    assert expect(released, 500, "RetryableFailure").run_status == "released"
    assert released.headers["Idempotency-Key"] == "gen-6"
    invalid = run.sync_detailed("effect", client=client, body=body("a token with spaces"))
    assert "clientToken" in expect(invalid, 400, "Problem").detail
    assert expect(run.sync_detailed("nope", client=client, body=body("gen-7")), 404, "Problem").error == "NotFound"
    too_large = run.sync_detailed("effect", client=client, body=body("gen-8", blob="0" * (1 << 20)))
    assert expect(too_large, 413, "Problem").status == 413
    not_json = run.sync_detailed("effect", client=api.client(before=text_plain), body=body("gen-9"))
    assert expect(not_json, 415, "Problem").status == 415

    # A run in progress: 409, with Retry-After, after waiting as Prefer asked.
    gate = tmp_path / "gate"
    holder = body("gen-10", gate_file=str(gate))
    first_call = threading.Thread(target=lambda: run.sync_detailed("long", client=api.client(), body=holder))
    first_call.start()
    try:
        runs = api.op("listRuns")
        for _ in range(200):
            if runs.sync_detailed(client=client, job="long", status=models.RunStatus.IN_PROGRESS).parsed.runs:
                break
            time.sleep(0.05)
        busy = run.sync_detailed("long", client=client, body=holder, prefer="wait=1")
        assert expect(busy, 409, "Busy").error == "RunInProgress" and busy.parsed.run_id
        assert 0 <= int(busy.headers["Retry-After"]) <= 30 and busy.headers["Preference-Applied"] == "wait=1"
    finally:
        gate.touch()
        first_call.join(30)
    assert api.seen["startManualRun"] == documented()["startManualRun"] - {401, 403}


def seed_another_jobs_run(ndb_client: Any, job_id: str, token: str, recorded_job_id: str) -> None:
    """A completed run of ``recorded_job_id`` under the key of ``job_id``'s manual run with ``token``:
    what a JobMismatch is about (no request of the API makes one)."""
    run_id = digest_parts(KEY_VERSION, MANUAL_RUN_NAMESPACE, job_id, token)
    now = datetime.datetime.now(datetime.UTC)
    attempt = {"attempt": 1, "attempt_id": "a" * 32, "outcome": "completed"}
    with ndb_client.context():
        RunRecord(
            id=run_id,
            source="api",
            job_id=recorded_job_id,
            fingerprint="f",
            status="completed",
            attempt_id="a" * 32,
            attempt=1,
            lease_expires=now,
            expire_at=now + datetime.timedelta(hours=1),
            created=now,
            updated=now,
            attempts=[attempt],
        ).put()


def test_the_run_api_answers_through_the_client_as_described(api, effects):
    client, models = api.client("viewer"), api.models
    body = models.StartManualRunBody(client_token="list-1", parameters=models.StartManualRunBodyParameters())
    body.parameters.additional_properties["dir"] = str(effects)
    made = expect(api.op("startManualRun").sync_detailed("effect", client=api.client(), body=body), 201, "ManualRun")
    listed = expect(api.op("listRuns").sync_detailed(client=client, job="effect", limit=10), 200, "RunsPage")
    assert [summary.run_id for summary in listed.runs] == [made.run_id] and listed.next_cursor is None
    bad_cursor = api.op("listRuns").sync_detailed(client=client, cursor="nonsense")
    assert "cursor" in expect(bad_cursor, 400, "Problem").detail
    record = expect(api.op("getRun").sync_detailed(made.run_id, client=client), 200, "Run")
    assert record.parameters.additional_properties == {"dir": str(effects)} and record.attempts[0].attempt == 1
    assert record.steps == [] and record.needs_review is None
    # A step decision for a run that waits on none: the refusal as described.
    operator = api.client()
    review = models.SettleStepBody(decision=models.SettleStepBodyDecision.DONE, attempt=1)
    settle = api.op("settleStep")
    assert expect(settle.sync_detailed("f" * 64, "s", client=operator, body=review), 404, "Problem").error == "NotFound"
    refused = expect(settle.sync_detailed(made.run_id, "s", client=operator, body=review), 409, "Problem")
    assert refused.error == "RunNotRetryable" and "scheduled slot" in refused.detail
    zero = models.SettleStepBody(decision=models.SettleStepBodyDecision.DONE, attempt=0)
    bad = settle.sync_detailed(made.run_id, "s", client=operator, body=zero)
    assert "attempt" in expect(bad, 400, "Problem").detail
    assert expect(api.op("getRun").sync_detailed("f" * 64, client=client), 404, "Problem").error == "NotFound"
    repeated = api.op("getRun").sync_detailed(made.run_id, client=api.client("viewer", before=twice))
    assert "given 2 times" in expect(repeated, 400, "Problem").detail

    status = expect(api.op("getStatus").sync_detailed(client=client), 200, "Status")
    assert status.datastore.fence in ("version", "transaction")
    description = api.op("getOpenApiDescription").sync_detailed(client=client)
    assert description.status_code == 200 and description.headers["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(description.content) == yaml.safe_load(SPEC_FILE.read_text())
    for operation in ("listRuns", "getRun", "getStatus", "getOpenApiDescription"):
        assert api.seen[operation] == documented()[operation] - {401, 403}, operation


def test_executions_and_slot_runs_answer_through_the_client_as_described(api, tokens, server, effects, cloud_tasks):
    client, models = api.client(), api.models
    slot, listing = api.op("runSlot"), api.op("listExecutions")

    # The slots, each named once: a minute turning during the test moves none of them.
    five, six, seven, ahead = minute(5), minute(6), minute(7), minute(-2)
    old = minute(RETENTION // 60 + 10)

    def run_slot(job: str, when: str, **options: Any) -> Any:
        return slot.sync_detailed(job, when, client=client, scheduler_job=f"{job}-every-minute", **options)

    done = run_slot("effect", five)
    assert expect(done, 200, "RunAnswer").duplicate is False and done.headers["X-Dedup-Run-Id"] == done.parsed.run_id
    again = run_slot("effect", five)
    assert expect(again, 200, "RunAnswer").duplicate is True and again.headers["Idempotent-Replayed"] == "true"
    failed = run_slot("refuse", five)
    assert expect(failed, 422, "RunAnswer").status == "failed" and "Idempotent-Replayed" not in failed.headers
    assert expect(run_slot("refuse", five), 428, "PreconditionRequired").attempt == 1
    reopened = run_slot("refuse", five, attempt=1)
    assert expect(reopened, 422, "RunAnswer").attempt == 2 and reopened.headers["X-Dedup-Run-Id"]
    replayed = run_slot("refuse", five, attempt=1)  # the same request again: answered from its attempt
    assert expect(replayed, 422, "RunAnswer").duplicate is True and replayed.headers["Idempotent-Replayed"] == "true"
    unknown = run_slot("effect", old)
    assert expect(unknown, 422, "ExecutionUnknown").execution_status == "unknown"
    assert expect(run_slot("effect", old, force=models.RunSlotForce.TRUE), 200, "RunAnswer").status == "completed"
    not_due = run_slot("effect", ahead)
    assert expect(not_due, 422, "Problem").error == "SlotNotDue"
    deliver(server, tokens, job="sleepy", slot_of="effect-every-minute", when=seven, body={"dir": str(effects)})
    mismatch = run_slot("effect", seven, attempt=0)
    assert expect(mismatch, 422, "JobMismatch").recorded_job_id == "sleepy"
    released = run_slot("long", five)  # no gate_file: it raises
    assert expect(released, 500, "RetryableFailure").run_status == "released" and released.headers["X-Dedup-Run-Id"]
    assert expect(run_slot("effect", "yesterday"), 400, "Problem").detail
    assert expect(run_slot("nope", five), 404, "Problem").error == "NotFound"

    # Another attempt holds the slot: 409 with Retry-After.
    first_call = threading.Thread(target=lambda: run_slot("sleepy", five))
    first_call.start()
    try:
        runs = api.op("listRuns")
        for _ in range(200):
            if runs.sync_detailed(client=client, job="sleepy", status=models.RunStatus.IN_PROGRESS).parsed.runs:
                break
            time.sleep(0.05)
        busy = run_slot("sleepy", five)
        assert expect(busy, 409, "Busy").error == "RunInProgress" and int(busy.headers["Retry-After"]) > 0
        assert busy.headers["X-Dedup-Run-Id"] == busy.parsed.run_id
    finally:
        first_call.join(30)

    # An external job's slot: queued to its handler (202), or not taken by the queue (502).
    queued = expect(run_slot("reports", five), 202, "RunSlotResponse202")
    assert (
        queued.queued is True and queued.already is False and [t.task_id for t in cloud_tasks.tasks] == [queued.task_id]
    )
    cloud_tasks.fail_next = [503]
    assert expect(run_slot("reports", six), 502, "Problem").error == "DispatchFailed"

    page = expect(
        listing.sync_detailed("effect", client=client, since=minute(RETENTION // 60 + 15)), 200, "ExecutionsPage"
    )
    assert {e.status for e in page.executions} >= {"completed", "missed", "unknown", "conflict"}
    backwards = listing.sync_detailed("effect", client=client, since=minute(1), until=minute(2))
    assert "before" in expect(backwards, 400, "Problem").detail
    assert expect(listing.sync_detailed("nope", client=client), 404, "Problem").error == "NotFound"
    for operation in ("runSlot", "listExecutions"):
        assert api.seen[operation] == documented()[operation] - {401, 403}, operation


def deliver(server: GunicornServer, tokens: dict[str, str], job: str, slot_of: str, when: str, body: Any) -> None:
    """Cloud Scheduler's delivery of ``slot_of``'s slot at ``when`` sent to ``job``'s URL (misrouted):
    a run of ``job`` under another job's slot key, what a slot's JobMismatch is about."""
    answer = requests.post(
        f"{server.url}/jobs/{job}?project=acme-prod&location=us-central1",
        data=json.dumps(body),
        headers={
            "Authorization": f"Bearer {tokens['scheduler']}",
            "X-CloudScheduler": "true",
            "X-CloudScheduler-JobName": slot_of,
            "X-CloudScheduler-ScheduleTime": when,
        },
        timeout=60,
    )
    assert answer.status_code == 200, answer.text


def test_scheduler_jobs_answer_through_the_client_as_described(api, google):
    client, models = api.client(), api.models
    pause, resume = api.op("pauseSchedulerJob"), api.op("resumeSchedulerJob")
    listed = expect(
        api.op("listSchedulerJobs").sync_detailed(client=api.client("viewer")), 200, "ListSchedulerJobsResponse200"
    )
    assert {job.scheduler_job for job in listed.scheduler_jobs} >= {"effect-every-minute", "reports-every-minute"}

    paused = pause.sync_detailed(
        "effect-every-minute", client=client, body=models.PauseSchedulerJobBody(note="incident 4711")
    )
    assert expect(paused, 200, "PauseChange").paused is True and paused.parsed.pause.note == "incident 4711"
    google.fail(":pause", status=503, api_status="UNAVAILABLE", message="try again")
    failing = pause.sync_detailed("refuse-every-minute", client=client, body=models.PauseSchedulerJobBody())
    assert expect(failing, 502, "PauseSchedulerJobResponse502").error == "CloudSchedulerError"
    assert failing.parsed.paused is True  # the app recorded it
    long_note = pause.sync_detailed(
        "effect-every-minute", client=client, body=models.PauseSchedulerJobBody(note="x" * 501)
    )
    assert "500" in expect(long_note, 400, "Problem").detail
    assert (
        expect(pause.sync_detailed("nope", client=client, body=models.PauseSchedulerJobBody()), 404, "Problem").status
        == 404
    )
    not_json = pause.sync_detailed(
        "effect-every-minute", client=api.client(before=text_plain), body=models.PauseSchedulerJobBody()
    )
    assert expect(not_json, 415, "Problem").status == 415

    # Cloud Scheduler resumes only a job it has paused: effect-every-minute's pause went through.
    google.fail(":resume", status=503, api_status="UNAVAILABLE", message="try again")
    failing = resume.sync_detailed("effect-every-minute", client=client, body=models.ResumeSchedulerJobBody())
    assert expect(failing, 502, "ResumeSchedulerJobResponse502").error == "CloudSchedulerError"
    assert failing.parsed.paused is False and failing.parsed.changed is True  # the app recorded it
    none = models.ResumeSchedulerJobBody(catch_up=models.ResumeSchedulerJobBodyCatchUp.NONE)
    resumed = expect(resume.sync_detailed("effect-every-minute", client=client, body=none), 200, "ResumeChange")
    assert resumed.paused is False and resumed.changed is False and resumed.caught_up == []
    assert google.scheduler_states["projects/acme-prod/locations/us-central1/jobs/effect-every-minute"] == "ENABLED"
    sometimes = models.ResumeSchedulerJobBody(catch_up=types.SimpleNamespace(value="sometimes"))  # not one of them
    assert (
        "catch_up"
        in expect(resume.sync_detailed("effect-every-minute", client=client, body=sometimes), 400, "Problem").detail
    )
    assert (
        expect(resume.sync_detailed("nope", client=client, body=models.ResumeSchedulerJobBody()), 404, "Problem").status
        == 404
    )
    not_json = resume.sync_detailed(
        "effect-every-minute", client=api.client(before=text_plain), body=models.ResumeSchedulerJobBody()
    )
    assert expect(not_json, 415, "Problem").status == 415
    for operation in ("listSchedulerJobs", "pauseSchedulerJob", "resumeSchedulerJob"):
        assert api.seen[operation] == documented()[operation] - {401, 403}, operation


@pytest.mark.skipif(shutil.which("npm") is None, reason="node and npm are not installed (make test installs them)")
def test_the_typescript_types_take_run_parameters_and_the_answers_headers(fetched, tmp_path):
    """The guide's commands in a folder with tests/clients/typescript's pins and typed call: npm ci
    installs the locked versions, openapi-typescript warns of nothing, and tsc accepts the call."""
    for name in ("package.json", "package-lock.json", "tsconfig.json", "call.ts"):
        shutil.copy(TYPESCRIPT / name, tmp_path / name)
    shutil.copy(fetched / "openapi.yaml", tmp_path / "openapi.yaml")
    done = run_documented(documented_blocks()[2], tmp_path)
    assert done.returncode == 0, done.stdout
    assert "openapi-typescript 7." in done.stdout and "⚠" not in done.stdout, done.stdout
    assert "export interface paths" in (tmp_path / "dedup-api.d.ts").read_text()


REDOCLY = ROOT / "tests" / "clients" / "redocly"


@pytest.mark.skipif(shutil.which("npm") is None, reason="node and npm are not installed (make test installs them)")
def test_redocly_finds_the_served_description_valid_with_no_warning(fetched: Path, tmp_path: Path) -> None:
    """Redocly's linter, its recommended rules, at the version tests/clients/redocly locks. It once
    found a description whose unquoted comma had turned "in words." into a property."""
    for name in ("package.json", "package-lock.json"):
        shutil.copy(REDOCLY / name, tmp_path / name)
    shutil.copy(fetched / "openapi.yaml", tmp_path / "openapi.yaml")
    quiet = {"REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true", "NO_COLOR": "1"}
    done = run_documented("npm ci --no-audit --no-fund\nnpx redocly lint openapi.yaml", tmp_path, **quiet)
    assert done.returncode == 0, done.stdout
    # Each problem it finds, error or warning, ends "... was generated by the <rule> rule."
    assert "Your API description is valid" in done.stdout and "was generated by" not in done.stdout, done.stdout
