"""Issue 35 §3, F4: a page that builds links from its query carries only the parameters it knows.

The queued run page copied every query parameter into ``url_for``, so ``?run_id=``,
``?endpoint=`` or ``?_method=`` (names ``url_for`` takes for itself or for the route's path)
answered 500.  The class: every GET route of the app, at the state where it builds its links
from the query (a queued run, a day and a range of history with its next page and bulk run,
each confirmation), is sent each such name, and answers without a 5xx, and no link it gives
carries the name it was sent.
"""

from __future__ import annotations

import textwrap
import urllib.parse

import pytest

from tests.support.schedule_sites import at
from tests.test_history_page import JOBS, SCHEDULES  # a 5-minute job in Berlin, a per-minute one

RUN_ID = "0" * 64
RANGE = {"since": "2030-01-01T00:00:00Z", "until": "2030-01-03T00:00:00Z"}  # two days: more than a page
# Names url_for takes for itself: given as its keywords beside the page's own, a copied query breaks it.
URL_FOR_NAMES = ("run_id", "endpoint", "_method", "_external", "_anchor", "_scheme")

# Each GET route, with its path's values and the query that makes it build links from the query.
PAGES = [
    ("admin.dashboard", {}, {}),
    ("admin.dashboard", {}, {"job": "invoice"}),
    ("admin.run_page", {"run_id": RUN_ID}, {"queued": "0"}),  # queued: refreshes itself
    ("admin.run_page", {"run_id": RUN_ID}, {"queued": "0", "polls": "3", "sent": "f" * 64}),
    ("admin.history", {"job_id": "invoice"}, {"day": "2030-01-01"}),  # a day, with its bulk run
    ("admin.history", {"job_id": "invoice"}, RANGE),  # a range, with its next page
    ("admin.history", {"job_id": "invoice"}, {**RANGE, "from": "2030-01-02T00:00:00Z"}),
    ("admin.search", {}, {"q": "invoice"}),
    ("home.index", {}, {}),
    ("dashboard_actions.confirm_run_now", {"job_id": "invoice"}, {}),
    ("dashboard_actions.confirm_run_now", {"job_id": "invoice"}, {"token": "a-token"}),
    ("dashboard_actions.confirm_retry", {"run_id": RUN_ID}, {}),
    ("dashboard_actions.confirm_run_slot", {"job_id": "invoice", "schedule_time": at(1)}, {"attempt": "0"}),
    ("dashboard_actions.confirm_pause", {"name": "invoice-5min"}, {}),
    ("dashboard_actions.confirm_resume", {"name": "invoice-5min"}, {}),
    ("dashboard_actions.confirm_bulk_run", {"job_id": "invoice"}, {"day": "2030-01-01", "hour": "3"}),
    ("dashboard_actions.confirm_bulk_run", {"job_id": "invoice"}, RANGE),
    ("runs_api.list_runs", {}, {}),
    ("runs_api.get_run", {"run_id": RUN_ID}, {}),
    ("runs_api.openapi_description", {}, {}),
    ("executions.list_executions", {"job_id": "invoice"}, {}),
    ("schedule_actions.list_scheduler_jobs", {}, {}),
    ("scheduler.deliver", {"job_id": "invoice"}, {}),
    ("tasks.cleanup_expired_runs", {}, {}),
    ("tasks.audit_missed_executions", {}, {}),
    ("problem_pages.problem_type_page", {"slug": "invalid-request"}, {}),
]
NOT_PAGES = {"static"}  # Flask's own files: no query read, no link built
# The second and third queries of a page that lists two days of the per-minute job's slots: each
# such case costs the fast tier over a second of CPU, so make test runs them (like the whole-day
# tests of tests/test_history_page.py) and make check the page's first query; the range's next
# page is followed in make check by test_the_parameters_a_page_knows_still_travel.
SLOW_PAGES = {
    ("admin.dashboard", ("job",)),
    ("admin.history", ("since", "until")),
    ("admin.history", ("from", "since", "until")),
}
# Pages of a second or more a render: make check sends them every name at once (a link that
# carries none of them, and the page's own status), make test each name alone as well.
HEAVY_PAGES = {
    ("admin.dashboard", ()),
    ("admin.history", ("day",)),
    ("tasks.audit_missed_executions", ()),
}


def page_cases():
    for endpoint, path, query in PAGES:
        names = (endpoint, tuple(sorted(query)))
        case = f"{endpoint}-{sorted(query)}"
        if names in SLOW_PAGES:
            yield pytest.param(endpoint, path, query, True, marks=[pytest.mark.slow], id=case)
        elif names in HEAVY_PAGES:
            yield pytest.param(endpoint, path, query, False, id=f"{case}-together")
            yield pytest.param(endpoint, path, query, True, marks=[pytest.mark.slow], id=case)
        else:
            yield pytest.param(endpoint, path, query, True, id=case)


@pytest.fixture
def site(make_client, tmp_path, clock):
    (tmp_path / "scheduler.yaml").write_text(textwrap.dedent(SCHEDULES))
    app = make_client(JOBS)
    app.get("/api/v1/scheduler-jobs")  # the app knows the schedule from 2030-01-01T00:00Z
    clock.advance(2 * 86400 + 60)  # two days of slots, none delivered: missed, to run in bulk
    return app


def page_url(app, endpoint: str, path: dict[str, str]) -> str:
    rule = next(rule for rule in app.app.url_map.iter_rules() if rule.endpoint == endpoint)
    built = rule.rule
    for name, value in path.items():
        built = built.replace(f"<{name}>", urllib.parse.quote(value, safe=""))
    return built


def links(response) -> list[str]:
    """Every link of the app's own a page or a redirect gives: hrefs, form actions, refresh URLs, Location."""
    found = [response.headers["Location"]] if "Location" in response.headers else []
    if response.content_type == "text/html":
        for tag in response.html.find_all(True):
            found += [tag[name] for name in ("href", "action", "data-url") if tag.has_attr(name)]
    return [urllib.parse.urlsplit(link) for link in found if link.startswith(("/", "http://localhost"))]


# A path's values for a GET route PAGES does not list (one added later): swept with no query.
SAMPLE_PATH = {"job_id": "invoice", "run_id": RUN_ID, "schedule_time": at(1), "name": "invoice-5min", "slug": "x"}


def test_every_other_get_route_is_sent_the_hostile_names_too(site):
    listed = {endpoint for endpoint, _, _ in PAGES} | NOT_PAGES
    others = [rule for rule in site.app.url_map.iter_rules() if "GET" in rule.methods and rule.endpoint not in listed]
    for rule in others:
        assert rule.arguments <= SAMPLE_PATH.keys(), f"{rule.rule}: add its path's values to SAMPLE_PATH"
        check_page(site, rule.endpoint, {name: SAMPLE_PATH[name] for name in rule.arguments}, {})


@pytest.mark.parametrize("endpoint, path, query, alone", list(page_cases()))
def test_a_page_carries_only_the_parameters_it_knows(site, endpoint, path, query, alone):
    check_page(site, endpoint, path, query, alone)


def check_page(site, endpoint: str, path: dict[str, str], query: dict[str, str], alone: bool = True) -> None:
    """The page, sent each name url_for takes and each of its path's (all at once, and unless not
    ``alone`` each alone): no 5xx, and no link carries one."""
    url = page_url(site, endpoint, path)
    plain = site.get(url, params=query, status="*")
    assert plain.status_int < 500, plain.text[:300]
    hostile = [*URL_FOR_NAMES, *path]
    for name in hostile if alone else ():
        answer = site.get(url, params={**query, name: "x"}, status="*")
        assert answer.status_int < 500, f"{url}?{name}=x: {answer.status} {answer.text[:300]}"
        carried = [link for link in links(answer) if name in urllib.parse.parse_qs(link.query)]
        assert carried == [], f"{url}?{name}=x travelled into {carried}"
    together = site.get(url, params={**query, **dict.fromkeys(hostile, "1")}, status="*")
    assert together.status_int < 500, together.text[:300]
    assert together.status_int == plain.status_int  # unknown names are ignored, not refused
    carried = [link for link in links(together) if set(hostile) & set(urllib.parse.parse_qs(link.query))]
    assert carried == [], f"{url}: names it does not know travelled into {carried}"


def test_the_parameters_a_page_knows_still_travel(site):
    sent = "f" * 64
    queued = site.get(f"/admin/runs/{RUN_ID}", params={"queued": "2", "polls": "3", "sent": sent, "run_id": "x"})
    refresh = urllib.parse.urlsplit(queued.html.find(id="reload")["href"])
    assert refresh.path == f"/admin/runs/{RUN_ID}"
    assert urllib.parse.parse_qs(refresh.query) == {"queued": ["2"], "sent": [sent], "polls": ["4"]}
    ranged = site.get("/admin/jobs/invoice/history", params={**RANGE, "endpoint": "x"}).html
    following = urllib.parse.urlsplit(ranged.find(id="next-page")["href"])
    assert set(urllib.parse.parse_qs(following.query)) == {"since", "until", "from"}
    assert "from=2030-01-02T00:00:00.000000Z" in following.query  # as url_for spelled it: ':' unescaped
    bulk = urllib.parse.urlsplit(ranged.find(id="bulk-run")["href"])
    assert urllib.parse.parse_qs(bulk.query) == {"since": [RANGE["since"]], "until": [RANGE["until"]]}
