"""Log lines cannot be forged: whatever a request sends, one record is one line.

The attack: a control character in a value that reaches a log message (the
path in every request's closing line, a header or a body a job logs, an
exception message quoting one) ends the line, and the rest is a fake record,
here ``POST /jobs/sync-crm 200 completed`` behind a fake timestamp.  The text
format (the default wherever GAE_ENV is unset) must escape it; the JSON
format must stay one object per line; a malformed X-Cloud-Trace-Context is
ignored.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote

import pytest
from flask import request

from handlers.auth import AuthSettings
from handlers.logs import CONTINUATION, SPAN_FIELD, TRACE_FIELD
from jobs import PermanentJobError, RetryableJobError, RunContext
from tests.support.deliveries import JOBS, scheduler_headers
from tests.support.logs import TRACE, json_logs, request_lines, text_logs  # noqa: F401 - fixtures

FORGED = "POST /jobs/sync-crm 200 completed"
FAKE_HEAD = "1999-12-31 23:59:59,999 INFO dedup.requests: "  # what a real line starts with, but fake
ATTACK = FAKE_HEAD + FORGED
# Every character that may end or rewrite a line somewhere a log is read.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# A line-breaking (or terminal-controlling) sequence: URL-encoded, as werkzeug decodes it, as the text log shows it.
BREAKS = [
    ("%0a", "\n", r"\n"),
    ("%0d", "\r", r"\r"),
    ("%0d%0a", "\r\n", r"\r\n"),
    ("%00", "\x00", r"\x00"),
    ("%09", "\t", r"\t"),
    ("%0b", "\x0b", r"\x0b"),
    ("%0c", "\x0c", r"\x0c"),
    ("%1c", "\x1c", r"\x1c"),
    ("%1e", "\x1e", r"\x1e"),
    ("%1b[31m", "\x1b[31m", r"\x1b[31m"),
    ("%1b[2K%0d", "\x1b[2K\r", r"\x1b[2K\r"),  # erase the line on a terminal, write over it
    ("%7f", "\x7f", r"\x7f"),
    ("%c2%85", "\x85", r"\x85"),  # NEL
    ("%c2%9b", "\x9b", r"\x9b"),  # CSI
    ("%e2%80%a8", "\u2028", r"\u2028"),
    ("%e2%80%a9", "\u2029", r"\u2029"),
    ("%e2%80%ae", "\u202e", r"\u202e"),  # right-to-left override: reorders what a terminal shows
    ("%e2%81%a6", "\u2066", r"\u2066"),
]
BREAK_IDS = [encoded for encoded, _, _ in BREAKS]
DECODED = [pytest.param(decoded, shown, id=encoded) for encoded, decoded, shown in BREAKS]
# What a header can carry past a real HTTP server: HTAB, obs-text (bytes 0x80-0xff, read as
# Latin-1, so NEL and CSI) and, with lenient servers, other controls.  Never CR, LF or NUL.
HEADER_BREAKS = [
    pytest.param(decoded, shown, id=encoded)
    for encoded, decoded, shown in BREAKS
    if not {"\r", "\n", "\x00"} & set(decoded) and all(ord(char) < 0x100 for char in decoded)
]
FORGING_JOBS = (
    JOBS
    + """
  chatty:
    kind: python
    target: tests.test_log_forging:log_request_values
  refusing:
    kind: python
    target: tests.test_log_forging:refuse_naming_the_customer
  failing:
    kind: python
    target: tests.test_log_forging:fail_naming_the_customer
"""
)
job_log = logging.getLogger("jobs.chatty")


def _customer(context: RunContext) -> str:
    return (context.body_json() or context.parameters)["customer"]


def log_request_values(context: RunContext) -> dict:
    """A job logging what it was given, as job code does: a header and a parameter."""
    if request.headers.get("X-Batch-Label"):
        job_log.info("batch label %s", request.headers["X-Batch-Label"])
    if "customer" in context.parameters:
        job_log.info("invoicing %s", context.parameters["customer"])
    return {"ok": True}


def refuse_naming_the_customer(context: RunContext) -> None:
    raise PermanentJobError(f"customer {_customer(context)} is unknown")  # dedup.runner logs it with %s


def fail_naming_the_customer(context: RunContext) -> None:
    raise RetryableJobError(f"the bank refused {_customer(context)}")  # logged with its traceback


def assert_one_line_per_record(logs) -> None:
    """Each record one physical line (its traceback's lines behind CONTINUATION), nothing
    forged at the start of a line, and no raw control character anywhere."""
    assert logs.records and logs.text.endswith("\n")
    lines = logs.text.split("\n")[:-1]
    assert logs.text.splitlines() == lines  # no \r, \v, \f, \x1c-\x1e, NEL, U+2028/9 break a line either
    assert len([line for line in lines if not line.startswith(CONTINUATION)]) == len(logs.records)
    for line in lines:
        assert not UNSAFE.search(line), line
        assert not line.startswith((FORGED, FAKE_HEAD)), line


@pytest.fixture
def client(make_client):
    return make_client(FORGING_JOBS)


# --- the path: every request's closing line ---------------------------------------------------

PATHS = {
    "job-name": "/jobs/invoice{}",  # an unknown job: 404
    "manual-run": "/api/v1/jobs/invoice{}/runs",
    "no-route": "/nowhere{}",
}


@pytest.mark.sample(9)
@pytest.mark.parametrize("route", PATHS)
@pytest.mark.parametrize("encoded, shown", [(e, s) for e, _, s in BREAKS], ids=BREAK_IDS)
def test_a_path_cannot_forge_a_text_line(client, text_logs, route, encoded, shown):
    path = PATHS[route].format(encoded + quote(ATTACK, safe="/:,"))
    client.post(path, headers=scheduler_headers(), status=404)
    assert_one_line_per_record(text_logs)
    assert PATHS[route].format(shown + ATTACK) + " 404" in text_logs.text  # escaped, still readable


@pytest.mark.sample(4)
@pytest.mark.parametrize("encoded, shown", [(e, s) for e, _, s in BREAKS], ids=BREAK_IDS)
def test_an_unauthenticated_path_cannot_forge_a_text_line(
    datastore, ndb_client, jobs_file, clock, text_logs, encoded, shown
):
    """Cloud Run with oidc: the 401 is logged too, so anyone on the internet could write lines."""
    import webtest

    from handlers import create_app

    auth = AuthSettings(modes=("oidc",), audience="https://dedup.example", allowed_emails=frozenset({"s@x.iam"}))
    app = create_app(jobs_file=jobs_file(FORGING_JOBS), clock=clock, ndb_client=ndb_client, auth=auth)
    webtest.TestApp(app).post("/jobs/invoice" + encoded + quote(ATTACK, safe="/:,"), status=401)
    assert_one_line_per_record(text_logs)
    assert f"/jobs/invoice{shown}{ATTACK} 401" in text_logs.text


@pytest.mark.sample(4)
@pytest.mark.parametrize("encoded, shown", [(e, s) for e, _, s in BREAKS], ids=BREAK_IDS)
def test_a_path_stays_one_json_line_and_decodes_without_control_characters(client, json_logs, encoded, shown):
    """What Cloud Logging decodes (jsonPayload) is escaped as the text format is: a reader
    printing jsonPayload.message sees one line, not a forged second one."""
    client.post("/jobs/invoice" + encoded + quote(ATTACK, safe="/:,"), headers=scheduler_headers(), status=404)
    assert json_logs.text.isascii() and "\u2028" not in json_logs.text
    (line,) = request_lines(json_logs())
    assert len(json_logs()) == len(json_logs.records)
    assert line["path"] == "/jobs/invoice" + shown + ATTACK
    assert line["message"] == f"POST /jobs/invoice{shown}{ATTACK} 404"
    assert not any(UNSAFE.search(value) for value in line.values() if isinstance(value, str))


# --- values a job logs: headers, parameters ---------------------------------------------------


@pytest.mark.parametrize("decoded, shown", HEADER_BREAKS)
def test_a_header_a_job_logs_cannot_forge_a_text_line(client, text_logs, decoded, shown):
    headers = scheduler_headers(**{"X-Batch-Label": "nightly" + decoded + ATTACK})
    client.post("/jobs/chatty", headers=headers, status=200)
    assert_one_line_per_record(text_logs)
    assert f"jobs.chatty: batch label nightly{shown}{ATTACK}" in text_logs.text


@pytest.mark.sample(4)
@pytest.mark.parametrize("decoded, shown", DECODED)
def test_a_manual_run_parameter_a_job_logs_cannot_forge_a_text_line(client, text_logs, decoded, shown):
    body = {"clientToken": "t-1", "parameters": {"customer": "acme" + decoded + ATTACK}}
    client.post_json("/api/v1/jobs/chatty/runs", body, status=201)
    assert_one_line_per_record(text_logs)
    assert f"jobs.chatty: invoicing acme{shown}{ATTACK}" in text_logs.text


# --- values dedup/ interpolates: exception messages, tracebacks -------------------------------


@pytest.mark.sample(4)
@pytest.mark.parametrize("decoded, shown", DECODED)
def test_an_exception_message_dedup_logs_cannot_forge_a_text_line(client, text_logs, decoded, shown):
    body = {"customer": "acme" + decoded + ATTACK}
    client.post_json("/jobs/refusing", body, headers=scheduler_headers(), status=422)
    assert_one_line_per_record(text_logs)
    assert f"failed permanently: customer acme{shown}{ATTACK} is unknown" in text_logs.text


@pytest.mark.sample(6)
@pytest.mark.parametrize("source", ["scheduler", "manual-run"])
@pytest.mark.parametrize("decoded, shown", DECODED)
def test_a_traceback_keeps_its_lines_behind_the_marker(client, text_logs, source, decoded, shown):
    """Tracebacks stay readable, but no line of one begins at column 0, and the exception's
    own message (quoting the request) stays on one line."""
    customer = "acme" + decoded + ATTACK
    if source == "scheduler":
        client.post_json("/jobs/failing", {"customer": customer}, headers=scheduler_headers(), status=500)
    else:
        client.post_json("/api/v1/jobs/failing/runs", {"parameters": {"customer": customer}}, status=500)
    assert_one_line_per_record(text_logs)
    traceback_lines = [line for line in text_logs.text.splitlines() if line.startswith(CONTINUATION)]
    assert traceback_lines[0] == CONTINUATION + "Traceback (most recent call last):"
    assert traceback_lines[-1] == f"{CONTINUATION}dedup.errors.RetryableJobError: the bank refused acme{shown}{ATTACK}"


# --- JSON: every value, whatever json.dumps makes of it -----------------------------------------


class Shifty:
    def __str__(self) -> str:
        return "a\nb\u2028c\x85d"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    "value, written",
    [
        pytest.param(Shifty(), "a\nb\u2028c\x85d", id="default=str"),
        pytest.param({("tuple", "key"): 1}, "{('tuple', 'key'): 1}", id="non-string-keys"),
        pytest.param(Unprintable(), "<unprintable Unprintable>", id="raising-str"),
    ],
)
def test_every_json_field_is_one_escaped_line(json_logs, value, written):
    logging.getLogger("dedup.test").warning("odd %s", "field", extra={"outcome": value})
    assert json_logs.text.isascii() and json_logs.text.count("\n") == 1
    (line,) = json_logs()
    assert line["message"] == "odd field" and line["outcome"] == written


# --- X-Cloud-Trace-Context ----------------------------------------------------------------------

TRACE_ID = "105445aa7843bc8bf206b12000100000"
MALFORMED_TRACES = {
    "short-trace": TRACE_ID[:-1] + "/1;o=1",
    "long-trace": TRACE_ID + "0/1;o=1",
    "non-hex": "g" + TRACE_ID[1:] + "/1;o=1",
    "zero-trace": "0" * 32 + "/1;o=1",
    "no-span": TRACE_ID,
    "empty-span": TRACE_ID + "/",
    "no-span-with-options": TRACE_ID + ";o=1",
    "empty-span-with-options": TRACE_ID + "/;o=1",
    "empty-options": TRACE_ID + "/1;o=",
    "other-options": TRACE_ID + "/1;x=1",
    "extra-segment": TRACE_ID + "/1/2",
    "extra-option": TRACE_ID + "/1;o=1;x=2",
    "span-over-64-bits": TRACE_ID + f"/{2**64};o=1",
    "negative-span": TRACE_ID + "/-1",
    "hex-span": TRACE_ID + "/0x1",
    "superscript-span": TRACE_ID + "/\u00b9",  # str.isdigit() says yes; int() refuses
    "arabic-indic-span": TRACE_ID + "/\u0661",  # int() reads 1; not the documented format
    "control-chars": TRACE_ID + "\x1b[31m/1;o=1",
    "tab": TRACE_ID + "/1\t;o=1",
    "nel": TRACE_ID + "/1;o=1\x85",
    "quotes": f'"{TRACE_ID}"/1;o=1',
    "dot-dot": "../x/1;o=1",
    "dot-dot-trace": f"../{TRACE_ID}/1",
    "resource-name": f"projects/other/traces/{TRACE_ID}/1",
    "spaces": f" {TRACE_ID} /1",
}


@pytest.mark.sample(6)
@pytest.mark.parametrize("header", MALFORMED_TRACES.values(), ids=MALFORMED_TRACES.keys())
def test_a_malformed_trace_header_is_ignored(client, json_logs, spans, header):
    """The request starts a trace of its own: nothing of the header becomes its lines' trace."""
    headers = {**scheduler_headers(**{"X-Cloud-Trace-Context": header}), "X-Batch-Label": "b"}
    client.post("/jobs/chatty", headers=headers, status=200)
    lines = json_logs()
    assert len(lines) == len(json_logs.records) >= 2  # the job's line and the closing line
    (server,) = [span for span in spans.get_finished_spans() if span.kind.name == "SERVER"]
    assert server.parent is None  # a root: the header named no trace it may join
    assert {line[TRACE_FIELD] for line in lines} == {f"projects/acme-prod/traces/{server.context.trace_id:032x}"}


@pytest.mark.parametrize(
    "header, span",
    [
        (TRACE, "0000000000000001"),
        (TRACE_ID + "/1", "0000000000000001"),
        (TRACE_ID + "/1;o=0", "0000000000000001"),
        (TRACE_ID + "/000123", "000000000000007b"),
        (TRACE_ID + f"/{2**64 - 1};o=1", "ffffffffffffffff"),
        (TRACE_ID.upper() + "/7", "0000000000000007"),
    ],
)
def test_a_documented_trace_header_gives_every_line_its_trace(client, json_logs, spans, header, span):
    """Every line carries the header's trace, and the span of the request, a child of the header's span."""
    headers = {**scheduler_headers(**{"X-Cloud-Trace-Context": header}), "X-Batch-Label": "b"}
    client.post("/jobs/chatty", headers=headers, status=200)
    lines = json_logs()
    assert len(lines) >= 2
    trace_id = header.split("/")[0].lower()  # as Cloud Trace spells it
    assert all(line[TRACE_FIELD] == f"projects/acme-prod/traces/{trace_id}" for line in lines)
    exported = spans.get_finished_spans()
    if header.endswith(";o=1"):  # sampled by the caller: the request's spans are recorded, under the header's
        (server,) = [s for s in exported if s.kind.name == "SERVER"]
        assert f"{server.parent.span_id:016x}" == span  # the header's span id, as 16 hex digits
        (closing,) = [line for line in lines if line["logger"] == "dedup.requests"]
        assert closing[SPAN_FIELD] == f"{server.context.span_id:016x}"
        # The job's own line sits in the job's span: each line names a span of this trace.
        assert {line[SPAN_FIELD] for line in lines} <= {f"{s.context.span_id:016x}" for s in exported}
    else:  # the caller did not sample the trace: nothing of it is exported
        assert exported == ()
