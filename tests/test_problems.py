"""Issue 22 §3: every error is an RFC 9457 problem, built in one place (handlers/problems.py).

The shape of every error answer any test provokes through ``make_client`` is checked by that
fixture (tests/conftest.py); here: the builder's rules, that every error code the handlers
send has a type, that each type's URI is served, and that docs/problems.md says what the
registry says.
"""

from __future__ import annotations

import ast
import html
import json
import re
import urllib.parse
from pathlib import Path

import pytest
from flask import Flask

from handlers.problems import MEDIA_TYPE, PROBLEM_TYPES, TYPES_BY_ERROR, problem
from service.errors import RefusalKind
from tests.support.deliveries import JOBS, deliver
from tests.support.manual_runs import start
from tests.support.problems import problem_violations

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def request_context():
    app = Flask(__name__)
    with app.test_request_context("/api/v1/jobs/invoice/runs?token=secret"):
        yield


def test_a_problem_carries_the_rfc_members_then_the_old_ones_then_the_occurrences(request_context):
    response = problem(409, "RunInProgress", "attempt 1 holds the lease", run_id="r1", attempt=1)
    assert response.status_code == 409 and response.mimetype == MEDIA_TYPE
    document = json.loads(response.get_data())
    assert list(document) == [
        *("type", "title", "status", "detail", "instance", "retryable"),
        *("error", "message", "run_id", "attempt"),
    ]
    assert document["type"] == "/problems/run-in-progress" and document["title"] == "Run in progress"
    assert document["status"] == 409 and document["retryable"] is True
    assert document["detail"] == document["message"] == "attempt 1 holds the lease"
    assert document["instance"] == "/api/v1/jobs/invoice/runs"  # never the query: it may hold a token


@pytest.mark.parametrize(
    "status, error, phrase, retryable",
    [
        (404, "NotFound", "Not Found", False),
        (405, "MethodNotAllowed", "Method Not Allowed", False),
        (413, "RequestEntityTooLarge", "Content Too Large", False),
        (429, "TooManyRequests", "Too Many Requests", True),
        (501, "NotImplemented", "Not Implemented", False),
        (502, "BadGateway", "Bad Gateway", True),
    ],
)
def test_a_plain_http_error_is_about_blank_titled_with_its_phrase(request_context, status, error, phrase, retryable):
    document = json.loads(problem(status, error, "what happened").get_data())
    assert (document["type"], document["title"], document["retryable"]) == ("about:blank", phrase, retryable)


def test_an_occurrence_may_say_it_is_retryable_or_not(request_context):
    assert json.loads(problem(500, "InternalError", "x", retryable=False).get_data())["retryable"] is False
    assert json.loads(problem(400, "BadRequest", "x", retryable=True).get_data())["retryable"] is True


@pytest.mark.parametrize("member", ["type", "title", "status", "detail", "instance", "error", "message"])
def test_an_occurrence_cannot_overwrite_a_problem_member(request_context, member):
    with pytest.raises(ValueError, match="reserved"):
        problem(409, "RunInProgress", "x", **{member: "run state"})


def test_a_503_cannot_be_built_and_a_type_keeps_its_status(request_context):
    with pytest.raises(ValueError, match="503"):
        problem(503, "InternalError", "down")
    with pytest.raises(ValueError, match="RunInProgress is a 409"):
        problem(500, "RunInProgress", "x")


def test_outside_a_request_a_problem_has_no_instance():
    app = Flask(__name__)
    with app.app_context():
        assert "instance" not in json.loads(problem(500, "InternalError", "x").get_data())


def _problem_codes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, code) for each literal error code given to problem(), a Rejection or the answers table's typed()."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "typed" and node.args:  # a row of the table: handlers.answers, dedup.answers
            code = node.args[0]
            if isinstance(code, ast.Subscript):  # the library's: typed(run["RunInProgress"])
                code = code.slice
        elif name in ("problem", "Rejection") and len(node.args) >= 2:
            code = node.args[1]
        else:
            continue
        if isinstance(code, ast.Constant) and isinstance(code.value, str):
            found.append((node.lineno, code.value))
    return found


def test_every_error_code_the_handlers_send_has_a_type_and_every_type_is_sent():
    sent = {}
    for path in sorted([*(ROOT / "handlers").rglob("*.py"), *(ROOT / "dedup").rglob("*.py")]):
        for line, code in _problem_codes(ast.parse(path.read_text())):
            sent.setdefault(code, f"{path.name}:{line}")
    for kind in RefusalKind:  # the service's refusals, answered as their kind (handlers.answers)
        sent.setdefault(kind.value, "service/errors.py")
    assert {code: where for code, where in sent.items() if code not in TYPES_BY_ERROR} == {}
    # A type no handler sends is documentation of nothing (bad_request_error's default: the guard).
    assert set(TYPES_BY_ERROR) - set(sent) <= {"InvalidIdempotencyRequest"}
    assert '"InvalidIdempotencyRequest"' in (ROOT / "dedup" / "adapters" / "flask_guard.py").read_text()


def test_every_type_uri_resolves_to_its_documentation(make_client):
    client = make_client(JOBS)
    refused = deliver(client, status=400, **{"X-CloudScheduler-JobName": ""})
    page_url = urllib.parse.urljoin("http://localhost" + refused.request.path, refused.json["type"])
    assert page_url == "http://localhost/problems/invalid-request"
    for kind in PROBLEM_TYPES:
        page = client.get(kind.uri, status=200)
        assert page.content_type == "text/html"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.text))
        assert kind.title in text and kind.explanation.replace("`", "") in text
        assert ("retryable: send the same request again" in text) is kind.retryable
    missing = client.get("/problems/no-such-type", status=404)
    assert missing.content_type == MEDIA_TYPE and "docs/problems.md" in missing.json["detail"]


def test_answers_of_each_endpoint_family_are_problems_a_generic_client_reads(make_client):
    """One error from each family, read as a generic RFC 9457 client reads it."""
    client = make_client(JOBS)
    answers = [
        deliver(client, status=400, schedule_time="yesterday"),
        start(client, token="bad token!", status=400),
        start(client, job="nope", status=404),
        client.post("/api/v1/runs", status=405),
        client.get("/api/v1/runs?limit=0", status=400),
    ]
    for answer in answers:
        assert answer.content_type == MEDIA_TYPE
        assert (
            problem_violations(answer.status_int, answer.headers["Content-Type"], answer.body, answer.request.path)
            == []
        )
        assert answer.json["status"] == answer.status_int and isinstance(answer.json["retryable"], bool)


def test_the_check_itself_finds_what_is_not_a_problem():
    """The fixture's check (tests/support/problems.py) can fail: each break of the rule is named."""
    good = {
        "type": "/problems/run-in-progress",
        "title": "Run in progress",
        "status": 409,
        "detail": "d",
        "instance": "/jobs/x",
        "retryable": True,
        "error": "RunInProgress",
        "message": "d",
    }

    def check(document, content_type=MEDIA_TYPE, status=409):
        return problem_violations(status, content_type, json.dumps(document).encode(), "/jobs/x")

    assert check(good) == []
    assert check(good, content_type="application/json")
    assert check({**good, "status": "in_progress"})
    assert check({**good, "type": "about:blank"})
    assert check({**good, "retryable": None})
    assert check({**good, "instance": "/elsewhere"})
    assert check({"error": "RunInProgress", "message": "d"}, content_type="application/json")
    assert check({"status": "failed", "error": {}}, content_type="application/json", status=422) == []


def test_docs_problems_md_says_what_the_registry_says():
    docs = (ROOT / "docs" / "problems.md").read_text()
    entries = re.findall(r"^### (\S+)\n\n(.*?)(?=^### |\Z)", docs, flags=re.M | re.S)
    assert [slug for slug, _ in entries] == [kind.slug for kind in PROBLEM_TYPES]
    for (_, text), kind in zip(entries, PROBLEM_TYPES, strict=True):
        retryable = "retryable" if kind.retryable else "not retryable"
        assert text.strip() == (
            f'**{kind.title}**: HTTP {kind.status}, `"error": "{kind.error}"`, {retryable}.\n\n{kind.explanation}'
        )
