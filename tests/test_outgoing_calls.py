"""What every outgoing call is made of (issue 40 §1 and §2): the audience a token is for, the
trace it carries, and how the Cloud Tasks client reaches its endpoint."""

from __future__ import annotations

import grpc
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport, CloudTasksRestTransport

from dispatch.cloud_tasks import grpc_endpoint, tasks_client
from jobs.base import origin_of, without_credentials
from jobs.config import parse_jobs
from jobs.errors import JobsConfigError
from jobs.trace_headers import traced


@pytest.mark.parametrize(
    "url, origin",
    [
        ("https://orders-3x7kq2mzla-uc.a.run.app/sync", "https://orders-3x7kq2mzla-uc.a.run.app"),
        ("https://Orders.A.Run.App:443/sync?x=1", "https://orders.a.run.app"),  # case and the default port
        ("https://orders.a.run.app./sync", "https://orders.a.run.app"),  # a fully qualified name's dot
        ("https://user:secret@orders.a.run.app/sync", "https://orders.a.run.app"),  # never the password
        ("https://orders.a.run.app:8443/", "https://orders.a.run.app:8443"),
        ("http://127.0.0.1:80/sync", "http://127.0.0.1"),
        ("http://[::1]:8080/sync", "http://[::1]:8080"),
    ],
)
def test_the_default_oidc_audience_is_the_origin_as_cloud_run_names_itself(url, origin):
    assert origin_of(url) == origin


def test_an_external_jobs_default_audience_is_its_url_without_credentials_query_or_fragment():
    assert without_credentials("https://u:p@h.acme.dev/tasks/run?x=1#f") == "https://h.acme.dev/tasks/run"


@pytest.mark.parametrize("url", ["http://sync.acme.dev/run", "http://10.0.0.7:8080/run"])
def test_a_token_never_goes_out_over_plain_http_but_to_loopback(url):
    for auth in ("{kind: oidc}", "{kind: iap, audience: 1-a.apps.googleusercontent.com}"):
        with pytest.raises(JobsConfigError) as caught:
            parse_jobs(f"jobs:\n  sync:\n    kind: http\n    url: {url}\n    auth: {auth}\n")
        assert "field 'url': must be https with auth" in str(caught.value)
    parse_jobs(f"jobs:\n  sync:\n    kind: http\n    url: {url}\n")  # no token: the job's own choice
    parse_jobs("jobs:\n  sync:\n    kind: http\n    url: http://127.0.0.1:9/run\n    auth: {kind: oidc}\n")


def test_a_configured_trace_header_in_any_case_gives_way_to_the_calls_trace():
    trace = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x-cloud-trace-context": "1" * 32 + "/2;o=1"}
    sent = traced({"Traceparent": "00-stale", "X-CLOUD-TRACE-CONTEXT": "stale", "X-Team": "a"}, trace)
    assert sent == {"X-Team": "a", **trace}
    assert traced({"X-Team": "a"}, {}) == {"X-Team": "a"}  # outside any span: nothing to continue


@pytest.mark.parametrize(
    "base, endpoint",
    [
        ("http://127.0.0.1:8123", "127.0.0.1:8123"),
        ("http://[::1]:8123", "[::1]:8123"),
        ("http://tasks-emulator", "tasks-emulator:80"),
        ("https://cloudtasks.googleapis.com", "cloudtasks.googleapis.com:443"),
        ("https://[2001:db8::1]", "[2001:db8::1]:443"),
    ],
)
def test_grpc_names_the_endpoint_with_its_port_and_brackets(base, endpoint):
    assert grpc_endpoint(base) == endpoint


def test_a_local_base_gets_no_tls_and_no_credentials_on_either_transport(google):
    over_grpc = tasks_client("http://127.0.0.1:8123", "grpc")
    assert isinstance(over_grpc._transport, CloudTasksGrpcTransport)
    assert isinstance(over_grpc._transport.grpc_channel, grpc.Channel)
    over_rest = tasks_client("http://127.0.0.1:8123", "rest")
    assert isinstance(over_rest._transport, CloudTasksRestTransport)
    assert isinstance(over_rest._transport._credentials, AnonymousCredentials)
    assert over_rest._transport._host == "http://127.0.0.1:8123"


def test_googles_endpoint_is_reached_with_the_apps_credentials(google):
    """An https base (Google's, or a private endpoint): TLS and Application Default Credentials,
    here the metadata server's stand-in's."""
    from google.auth import compute_engine

    for transport in ("grpc", "rest"):
        client = tasks_client("https://cloudtasks.googleapis.com", transport)
        assert isinstance(client._transport._credentials, compute_engine.Credentials), transport
    assert isinstance(tasks_client(None, "grpc")._transport._credentials, compute_engine.Credentials)
