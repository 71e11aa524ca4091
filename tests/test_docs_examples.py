"""The code the docs show is code that runs: every ``python`` block of README.md, library/README.md and docs/
is a verbatim part of a file in examples/, and each of those files is exercised here."""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys

import pytest
import webtest
import yaml

from jobs.config import parse_jobs
from tests.support.deliveries import scheduler_headers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [
    "README.md",
    "library/README.md",
    *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
]


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for name in DOCS:
        with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
            found += [(name, block) for block in re.findall(rf"```{language}\n(.*?)```", handle.read(), re.S)]
    return found


def examples() -> str:
    texts = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        with open(path, encoding="utf-8") as handle:
            texts.append(handle.read())
    return "\n".join(texts)


def test_the_docs_show_python():
    assert len(blocks("python")) >= 3


@pytest.mark.parametrize("doc, block", blocks("python"), ids=lambda v: v if len(v) < 40 else v[:40])
def test_every_python_snippet_is_part_of_an_example_that_runs(doc, block):
    assert block in examples(), f"{doc}: this snippet is not in examples/*.py, so nothing runs it:\n{block}"


@pytest.fixture
def your_reports(tmp_path, monkeypatch):
    """examples/report_job.py copied where docs/jobs.md says: reports/nightly.py, a package of the
    user's beside main.py (examples/ is not deployed)."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "__init__.py").write_text("")
    shutil.copyfile(os.path.join(ROOT, "examples", "report_job.py"), tmp_path / "reports" / "nightly.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("reports", "reports.nightly"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("doc, block", [b for b in blocks("yaml") if b[1].lstrip().startswith("jobs:")])
def test_every_jobs_file_snippet_is_a_valid_jobs_file(doc, block, your_reports):
    assert parse_jobs(block)  # the app would start with it


@pytest.mark.parametrize("doc, block", [b for b in blocks("yaml") if b[1].lstrip().startswith("# scheduler.yaml")])
def test_every_scheduler_file_snippet_is_a_valid_scheduler_file(doc, block):
    from jobs.config import load_strict_yaml
    from schedules.config import parse_scheduler_document

    document = load_strict_yaml(block)
    document.setdefault("defaults", {"project": "acme-prod", "location": "us-central1"})
    assert parse_scheduler_document(document)  # the app would start with it


def test_the_guarded_payments_example(datastore):
    from examples import guarded_payments

    guarded_payments.PAYMENTS.clear()
    app = webtest.TestApp(guarded_payments.app)
    headers = {"Idempotency-Key": "pay-1", "X-Tenant": "acme"}
    first = app.post_json("/payments", {"amount": 5, "currency": "EUR"}, headers=headers, status=201)
    again = app.post_json("/payments", {"amount": 5, "currency": "EUR"}, headers=headers, status=201)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json
    assert again.headers["Location"] == first.headers["Location"] == "/payments/1"
    other = app.post_json("/payments", {"amount": 6, "currency": "EUR"}, headers=headers, status=422)
    assert other.json["differing"] == ["amount"] and other.content_type == "application/problem+json"
    assert "Use a new key" in app.get(other.json["type"], status=200).text  # the type's page, served
    app.post_json("/payments", {"amount": 5, "currency": "EUR"}, headers={**headers, "X-Tenant": "beta"}, status=201)
    assert [p["id"] for p in guarded_payments.PAYMENTS] == [1, 2]  # once per tenant


def test_the_guarded_shipping_example(ndb_context):
    from examples import guarded_shipping

    guarded_shipping.SHIPPED.clear()
    order = {"id": "o-1", "address": "1 Main St"}
    assert guarded_shipping.ship(order) == guarded_shipping.ship(order) == {"label": "label-o-1"}
    assert guarded_shipping.SHIPPED == ["o-1"]


def test_the_report_job_example_as_the_docs_declare_it(make_client, your_reports):
    (declared,) = [b for _, b in blocks("yaml") if "reports.nightly:build_report" in b]
    nightly = {"jobs": {"nightly-report": yaml.safe_load(declared)["jobs"]["nightly-report"]}}
    client = make_client(yaml.safe_dump(nightly))
    done = client.post("/jobs/nightly-report", b'{"rows": 7}', headers=scheduler_headers(), status=200)
    assert done.json["result"] == {"rows": 7, "report_key": done.json["run_id"]}
    bad = client.post(
        "/jobs/nightly-report", b'{"rows": "x"}', headers=scheduler_headers(scheduler_job_name="b"), status=422
    )
    assert "whole number" in bad.json["error"]["message"]


def test_the_stepped_job_example_resumes_after_its_recorded_steps(make_client, monkeypatch):
    from examples import stepped_job

    for service in (stepped_job.billing, stepped_job.payments, stepped_job.mailer):
        monkeypatch.setattr(service, "applied", {})
    jobs = "jobs:\n  billing: {kind: python, target: 'examples.stepped_job:bill_customer', lease_seconds: 60}\n"
    client = make_client(jobs)
    sent = stepped_job.mailer.call
    calls = {"reserve": 0, "charge": 0}
    monkeypatch.setattr(stepped_job.billing, "call", counted(stepped_job.billing.call, calls, "reserve"))
    monkeypatch.setattr(stepped_job.payments, "call", counted(stepped_job.payments.call, calls, "charge"))

    def mail_once_down(key, **fields):
        monkeypatch.setattr(stepped_job.mailer, "call", sent)
        raise ConnectionError("the mailer is down")

    monkeypatch.setattr(stepped_job.mailer, "call", mail_once_down)
    headers = scheduler_headers(scheduler_job_name="billing")
    assert client.post("/jobs/billing", b"", headers=headers, status=500).json["attempt"] == 1
    done = client.post("/jobs/billing", b"", headers=headers, status=200)
    assert done.json["attempt"] == 2
    assert done.json["result"] == {"invoice": "invoice-1", "charge": "charge-1", "receipt": "receipt-1"}
    assert calls == {"reserve": 1, "charge": 1}  # recorded at attempt 1: not called again
    assert list(stepped_job.mailer.applied) == [f"{done.json['run_id']}:notify"]


def counted(call, calls, name):
    def wrapper(key, **fields):
        calls[name] += 1
        return call(key, **fields)

    return wrapper
