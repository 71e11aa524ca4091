"""Shared fixtures: one real Datastore emulator per test session, wiped per test.

A test marked ``both_emulators`` runs twice, once on each of Google's Datastore-mode emulators
(``datastore_flavor``: ``legacy``, the Cloud Datastore emulator, which refuses a stale version;
``firestore``, the Firestore emulator in Datastore mode, which applies one).  Every other test
runs on the legacy one.  ``datastore`` proves the chosen one's fence, as the app does at
start-up (dedup/fence_check.py), so each test sees the path the app would take there.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import webtest
from google.cloud import ndb

from dedup import fence_probe
from dedup.clock import ManualClock
from devtools.emulator import FLAVORS, DatastoreEmulator
from tests import job_targets
from tests.support import routing_cache, sampling, template_cache

routing_cache.install()
template_cache.install()

# Tests run outside App Engine: caller verification is chosen explicitly, and
# the tests of the other modes pass their own settings.
os.environ["DEDUP_AUTH"] = "none"
os.environ.pop("GAE_ENV", None)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_emulators") and "datastore" in metafunc.fixturenames:
        metafunc.parametrize("datastore_flavor", flavor_params(), indirect=True)


def flavor_params() -> list:
    """Each emulator as a parameter; the Firestore one's cases carry the ``firestore`` mark, which
    ``make check`` leaves to ``make test`` (its JVM per worker costs the inner loop a third more)."""
    return [pytest.param(flavor, marks=[pytest.mark.firestore] if flavor == "firestore" else []) for flavor in FLAVORS]


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the cases a sample leaves out are exhaustive
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sampling.mark_outside_samples(items)


def _session_emulator() -> DatastoreEmulator:
    # Every query in every test must be served by an index in index.yaml, as in production.
    return DatastoreEmulator(project="dedup-test", require_indexes=os.path.join(ROOT, "index.yaml"), quick_jit=True)


_spawned: list[DatastoreEmulator] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """A process that runs tests starts its emulator's JVM now, to boot while tests are collected
    (a second or two of each worker's start).  An xdist controller runs no tests; --collect-only none."""
    config = session.config
    controller = config.pluginmanager.hasplugin("dsession")  # xdist's scheduling side
    if not controller and not config.option.collectonly:
        _spawned.append(_session_emulator().spawn())


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _spawned:  # a session whose tests never needed it
        _spawned.pop().stop()


@pytest.fixture(scope="session")
def emulator():
    running = _spawned.pop() if _spawned else _session_emulator().spawn()
    try:
        running.wait_ready()
        os.environ.update(running.env)
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def firestore_emulator():
    """The Firestore emulator in Datastore mode, started the first time a test asks for it."""
    # A project of its own: the app keeps one fence check per database (dedup/fence_check.py).
    running = DatastoreEmulator(project="dedup-test-firestore", flavor="firestore", quick_jit=True).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def datastore_flavor(request) -> str:
    """Which emulator this test runs on: ``legacy`` unless it is marked ``both_emulators``."""
    return getattr(request, "param", "legacy")


_ndb_clients: dict[str, ndb.Client] = {}


@pytest.fixture
def datastore(datastore_flavor, request, monkeypatch):
    """A wiped emulator, its fence checked: every test starts from an empty Datastore."""
    return wiped_emulator(datastore_flavor, request, monkeypatch)


def wiped_emulator(flavor: str, request, monkeypatch) -> DatastoreEmulator:
    """The ``flavor`` emulator, wiped, named by the environment for this test, its fence checked."""
    chosen = request.getfixturevalue("emulator")
    if flavor == "firestore":
        chosen = request.getfixturevalue("firestore_emulator")
        for name, value in chosen.env.items():
            monkeypatch.setenv(name, value)  # clients and servers built in this test find it
    chosen.reset()
    job_targets.reset()
    fence_probe.verify(ndb_client_of(chosen))
    return chosen


def ndb_client_of(running: DatastoreEmulator) -> ndb.Client:
    """One NDB client per emulator (made while the environment names it, as ndb.Client reads it)."""
    client = _ndb_clients.get(running.host)
    if client is None:
        client = _ndb_clients[running.host] = ndb.Client(project=running.project)
        assert client.host == running.host, (client.host, running.host)
    return client


@pytest.fixture(scope="session")
def google_fakes(emulator, tmp_path_factory):
    """Fake Google APIs and metadata server; google-auth's ADC finds the latter as on App Engine."""
    from devtools.google_fakes import GoogleFakes

    fakes = GoogleFakes()
    os.environ["GCE_METADATA_HOST"] = fakes.host
    os.environ["GCE_METADATA_IP"] = fakes.host
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    os.environ["CLOUDSDK_CONFIG"] = str(tmp_path_factory.mktemp("gcloud-config"))  # no user ADC file
    yield fakes
    fakes.close()


@pytest.fixture(scope="session")
def _cloud_tasks_fake():
    from devtools.cloud_tasks_fake import CloudTasksFake

    fake = CloudTasksFake()
    yield fake
    fake.close()


@pytest.fixture
def cloud_tasks(_cloud_tasks_fake, google, monkeypatch):
    """The Cloud Tasks stand-in, empty, named by DEDUP_TASKS_QUEUE, DEDUP_TASKS_API_BASE and
    DEDUP_TASKS_TRANSPORT=rest for apps built now."""
    _cloud_tasks_fake.reset()
    monkeypatch.setenv("DEDUP_TASKS_QUEUE", "projects/acme-prod/locations/us-central1/queues/dedup-dispatch")
    monkeypatch.setenv("DEDUP_TASKS_API_BASE", _cloud_tasks_fake.url)
    monkeypatch.setenv("DEDUP_TASKS_TRANSPORT", "rest")  # the stand-in speaks REST; the emulator tier gRPC
    return _cloud_tasks_fake


@pytest.fixture
def google(google_fakes, datastore, clock):
    google_fakes.reset()
    google_fakes.clock = clock
    return google_fakes


@pytest.fixture
def ndb_client(datastore):
    return ndb_client_of(datastore)


@pytest.fixture
def ndb_context(datastore, ndb_client):
    with ndb_client.context():
        yield


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def jobs_file(tmp_path):
    """Write a jobs file from YAML text (dedented) and return its path."""

    def write(text: str) -> str:
        path = tmp_path / "jobs.yaml"
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write


@pytest.fixture
def make_client(datastore, ndb_client, jobs_file, clock):
    """A webtest TestApp over create_app() with the given jobs YAML.

    Every error answer any test provokes through it is checked to be an RFC 9457 problem.
    """
    from flask import request

    from handlers import create_app
    from tests.support.problems import problem_violations

    violations: list[str] = []

    def build(jobs_yaml: str) -> webtest.TestApp:
        app = create_app(jobs_file=jobs_file(jobs_yaml), clock=clock, ndb_client=ndb_client)

        @app.after_request
        def check_problem(response):
            if not response.is_streamed:
                violations.extend(
                    problem_violations(
                        response.status_code, response.content_type or "", response.get_data(), request.path
                    )
                )
            return response

        return webtest.TestApp(app)

    yield build
    assert not violations, "error answers that are not problems:\n" + "\n".join(violations)


@pytest.fixture(scope="session", autouse=True)
def _metric_reader():
    """The process's meter provider (handlers.metrics: one per process), made before any app is,
    with an in-memory reader: what a test's runs, audits and answers counted (``measured``)."""
    from handlers.metrics import configure_metrics
    from settings import Settings
    from tests.support.metrics import in_memory_reader

    reader = in_memory_reader()
    configure_metrics(Settings.from_environ(os.environ), readers=[reader])
    return reader


@pytest.fixture
def measured(_metric_reader):
    """The metrics this test records (tests/support/metrics.py), read when asked."""
    from tests.support.metrics import Measured

    return Measured(_metric_reader)


@pytest.fixture(scope="session")
def _span_exporter():
    """The process's tracer provider (handlers.tracing: one per process) with an in-memory exporter."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from handlers.tracing import configure_tracing
    from settings import Settings

    exporter = InMemorySpanExporter()
    configure_tracing(Settings.from_environ(os.environ)).add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(_span_exporter):
    """The spans this test ends, in the order they ended."""
    _span_exporter.clear()
    yield _span_exporter
    _span_exporter.clear()
