"""Spans: a server span per request in the caller's trace, around the protocol's claim, job and finish.

Checked with the SDK's in-memory exporter on the process's provider (``spans``),
against the emulator; the Cloud Trace exporter is only built (Google's API is
out of reach here), with the choice of exporter held to the settings.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace

from handlers.tracing import TracingConfigError, cloud_trace_processor, incoming_context
from settings import Settings, trace_export
from tests.support.deliveries import scheduler_headers

JOBS = """
jobs:
  invoice:
    kind: python
    target: tests.job_targets:record
"""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def by_name(spans) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in spans.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def test_a_delivery_is_a_server_span_with_the_claim_the_job_and_the_finish_inside(make_client, spans):
    client = make_client(JOBS)
    answer = client.post("/jobs/invoice", headers={**scheduler_headers(), "traceparent": TRACEPARENT}, status=200)
    found = by_name(spans)
    (server,) = found["POST /jobs/<job_id>"]
    assert server.kind == trace.SpanKind.SERVER and f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent.span_id == 0x00F067AA0BA902B7  # the caller's span
    steps = [found[name][0] for name in ("dedup.claim", "dedup.job", "dedup.finish")]
    assert all(step.parent.span_id == server.context.span_id for step in steps)
    assert all(step.attributes["run_id"] == answer.json["run_id"] for step in steps)
    claim, job, finish = steps
    assert claim.attributes["outcome"] == "Claimed" and claim.attributes["attempt"] == 1
    assert job.attributes["attempt"] == 1 and job.status.is_ok
    assert finish.attributes["outcome"] == "Finished" and finish.attributes["status"] == "completed"
    assert server.attributes["replayed"] is False and server.attributes["outcome"] == "completed"
    assert server.attributes["http.response.status_code"] == 200
    assert claim.end_time <= job.start_time and job.end_time <= finish.start_time


def test_a_duplicate_is_a_replayed_claim_and_runs_no_job(make_client, spans):
    client = make_client(JOBS)
    client.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    spans.clear()
    client.post("/jobs/invoice", headers=scheduler_headers(), status=200)
    found = by_name(spans)
    assert "dedup.job" not in found and "dedup.finish" not in found
    (claim,) = found["dedup.claim"]
    assert claim.attributes["outcome"] == "Replayed" and claim.attributes["replayed"] is True
    assert found["POST /jobs/<job_id>"][0].attributes["replayed"] is True


def test_a_failing_job_marks_its_span(make_client, spans):
    from tests import job_targets

    client = make_client(JOBS.replace("tests.job_targets:record", "tests.job_targets:scripted_failures"))
    job_targets.FAILURES["invoice"] = ["permanent"]
    client.post("/jobs/invoice", headers=scheduler_headers(), status=422)
    (job,) = by_name(spans)["dedup.job"]
    assert job.status.status_code == trace.StatusCode.ERROR


def test_traceparent_is_preferred_and_app_engines_header_is_the_fallback():
    both = incoming_context({"traceparent": TRACEPARENT, "X-Cloud-Trace-Context": "1" * 32 + "/5;o=1"})
    assert f"{trace.get_current_span(both).get_span_context().trace_id:032x}" == TRACE_ID
    legacy = trace.get_current_span(incoming_context({"X-Cloud-Trace-Context": "1" * 32 + "/5;o=1"}))
    assert legacy.get_span_context().span_id == 5 and legacy.get_span_context().trace_flags.sampled
    assert incoming_context({"traceparent": "00-bad", "X-Cloud-Trace-Context": "nope"}) is None


def test_spans_go_to_cloud_trace_on_app_engine_and_nowhere_by_default_elsewhere():
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.trace_v2 import TraceServiceClient
    from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

    assert trace_export({"GAE_ENV": "standard"}) == "cloud-trace"
    assert trace_export({}) == "none" and trace_export({"GAE_ENV": "localdev"}) == "none"
    assert trace_export({"DEDUP_TRACE_EXPORT": "cloud-trace"}) == "cloud-trace"
    client = TraceServiceClient(credentials=AnonymousCredentials())
    processor = cloud_trace_processor(Settings(project="acme-prod"), client=client)
    try:
        assert isinstance(processor.span_exporter, CloudTraceSpanExporter)
        assert processor.span_exporter.project_id == "acme-prod"
    finally:
        processor.shutdown()


@pytest.mark.parametrize("value", ["zipkin", "yes", "cloud_trace"])
def test_an_unknown_exporter_stops_the_app_at_start_up(make_client, monkeypatch, value):
    monkeypatch.setenv("DEDUP_TRACE_EXPORT", value)
    with pytest.raises(TracingConfigError, match="DEDUP_TRACE_EXPORT must be one of cloud-trace, none"):
        make_client(JOBS)


def test_without_credentials_spans_are_not_exported_and_the_app_still_serves(caplog):
    """Traces are for looking: a missing credential is an ERROR line, not an app that cannot start."""
    import google.auth.exceptions

    from handlers.tracing import new_provider

    def no_credentials(settings):
        raise google.auth.exceptions.DefaultCredentialsError("no ADC here")

    on_app_engine = Settings.from_environ({"GAE_ENV": "standard"})
    provider = new_provider(on_app_engine, no_credentials)
    assert provider._active_span_processor._span_processors == ()
    assert "spans will not be exported to Cloud Trace: no ADC here" in caplog.text
    exported = []
    to_cloud_trace = Settings(trace_export="cloud-trace")
    provider = new_provider(to_cloud_trace, lambda settings: exported.append(settings) or _NullProcessor())
    assert exported == [to_cloud_trace] and len(provider._active_span_processor._span_processors) == 1
    assert new_provider(Settings(), exported.append)._active_span_processor._span_processors == ()


class _NullProcessor:
    def on_start(self, span, parent_context=None):
        pass

    def on_end(self, span):
        pass

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def test_a_jobs_downstream_call_continues_the_deliverys_trace_from_the_job_span(make_client, spans):
    """Issue 40 §1: one trace from Cloud Scheduler's delivery through the downstream call."""
    from tests.support.downstream import Downstream

    with Downstream() as downstream:
        client = make_client(f"""
            jobs:
              sync:
                kind: http
                url: {downstream.url}/sync
                timeout_seconds: 5
                lease_seconds: 30
        """)
        client.post("/jobs/sync", headers={**scheduler_headers(), "traceparent": TRACEPARENT}, status=200)
        [sent] = downstream.requests
    headers = {name.lower(): value for name, value in sent.headers.items()}
    (job,) = by_name(spans)["dedup.job"]
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    assert (trace_id, int(parent, 16)) == (TRACE_ID, job.context.span_id)  # the job's span is its parent
    # Google's own header names the same trace and span, the span in decimal, sampled.
    assert headers["x-cloud-trace-context"] == f"{TRACE_ID}/{job.context.span_id};o=1"


def test_a_google_api_call_and_a_dispatched_task_carry_the_trace(make_client, spans, google, cloud_tasks):
    """The workflow kind's call to the Workflows API, and a Run now's task, each in the caller's trace."""
    from devtools.cloud_tasks_fake import to_webtest

    client = make_client(f"""
        jobs:
          etl:
            kind: workflow
            workflow: projects/acme-prod/locations/us-central1/workflows/nightly-etl
            api_base: {google.url}
            timeout_seconds: 2
            lease_seconds: 30
    """)
    client.post("/jobs/etl", headers={**scheduler_headers(), "traceparent": TRACEPARENT}, status=200)
    [created] = [call for call in google.api_calls("POST") if call.path.endswith("/executions")]
    (job,) = by_name(spans)["dedup.job"]
    assert created.headers["traceparent"].split("-")[1:3] == [TRACE_ID, f"{job.context.span_id:016x}"]
    assert created.headers["X-Cloud-Trace-Context"].startswith(f"{TRACE_ID}/{job.context.span_id}")
    # A task made inside a request continues that request's trace, and its delivery continues it on.
    page = client.get("/admin/jobs/etl/run?token=6f1c2b8e-8d4a-4d8e-9a51-0c3f5b7e2d10")
    form = page.forms["confirm"]
    spans.clear()
    form.submit(headers={"Sec-Fetch-Site": "same-origin", "traceparent": TRACEPARENT}, status=303)
    [task] = cloud_tasks.tasks
    (asked,) = by_name(spans)["POST /admin/jobs/<job_id>/run"]
    assert task.headers["traceparent"].split("-")[1:3] == [TRACE_ID, f"{asked.context.span_id:016x}"]
    spans.clear()
    cloud_tasks.deliver(to_webtest(client))
    (delivered,) = by_name(spans)["POST /tasks/manual-run"]
    assert f"{delivered.context.trace_id:032x}" == TRACE_ID and delivered.parent.span_id == asked.context.span_id


def test_a_python_job_gets_the_runs_trace_for_its_own_calls(make_client, spans):
    from tests import job_targets

    client = make_client(JOBS.replace("tests.job_targets:record", "tests.job_targets:trace_headers"))
    client.post("/jobs/invoice", headers={**scheduler_headers(), "traceparent": TRACEPARENT}, status=200)
    (job,) = by_name(spans)["dedup.job"]
    [headers] = job_targets.TRACE_HEADERS
    assert headers["traceparent"].split("-")[1:3] == [TRACE_ID, f"{job.context.span_id:016x}"]
    assert headers["x-cloud-trace-context"] == f"{TRACE_ID}/{job.context.span_id};o=1"


def test_make_runs_in_process_queue_and_an_external_jobs_task_carry_the_trace(make_client, spans):
    """Without Cloud Tasks (make run), a queued Run now continues the click's trace; and an HTTP
    task to an external job's handler carries it, a configured trace header giving way."""
    client = make_client(JOBS)
    page = client.get("/admin/jobs/invoice/run?token=6f1c2b8e-8d4a-4d8e-9a51-0c3f5b7e2d10")
    spans.clear()
    page.forms["confirm"].submit(headers={"Sec-Fetch-Site": "same-origin", "traceparent": TRACEPARENT}, status=303)
    client.app.extensions["dedup"].dispatcher.wait(timeout=30)
    (asked,) = by_name(spans)["POST /admin/jobs/<job_id>/run"]
    (delivered,) = by_name(spans)["POST /tasks/manual-run"]
    assert f"{delivered.context.trace_id:032x}" == TRACE_ID and delivered.parent.span_id == asked.context.span_id


def test_an_http_task_carries_one_trace():
    from dispatch import HttpTarget
    from dispatch.cloud_tasks import http_request

    target = HttpTarget("https://h.acme.dev/run", "POST", {"Traceparent": "00-stale", "X-Team": "a"}, b"", "a@b", "x")
    request = http_request(target, {"traceparent": TRACEPARENT})
    assert dict(request.headers) == {"X-Team": "a", "traceparent": TRACEPARENT}
