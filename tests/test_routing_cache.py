"""tests/support/routing_cache.py: one compiled URL builder per rule, and werkzeug's URLs."""

from __future__ import annotations

import pytest
from werkzeug.routing import Map, Rule

from tests.support import routing_cache

RULES = [
    ("/runs/<run_id>", None),
    ("/jobs/<path:name>", None),
    ("/n/<v>", None),
    ("/n/<int:v>", None),
    ("/p/<int:page>", {"page": 1}),
    ("/static", None),
]
VALUES = [{}, {"run_id": "a b/c?"}, {"name": "a/b c"}, {"v": "x/y"}, {"v": 7}, {"page": 3}, {"q": "1 2", "v": 5}]


def built(rules):
    """Every URL each rule builds from each value set (None where the values don't fit)."""
    urls = Map([Rule(text, endpoint=str(i), defaults=defaults) for i, (text, defaults) in enumerate(rules)])
    bound = urls.bind("example.com")
    out = []
    for i in range(len(rules)):
        for values in VALUES:
            try:
                out.append(bound.build(str(i), values))
            except Exception as error:  # werkzeug's own refusal, compared by kind
                out.append(type(error).__name__)
    return out


@pytest.fixture
def werkzeug_own(monkeypatch):
    monkeypatch.setattr(Rule, "_compile_builder", routing_cache._original)


def test_the_cache_is_installed_and_shares_a_rules_builder():
    first, second = (Map([Rule("/runs/<run_id>", endpoint="run")]) for _ in range(2))
    rule_one, rule_two = (next(iter(m.iter_rules("run"))) for m in (first, second))
    assert rule_one._build_unknown.__func__ is rule_two._build_unknown.__func__


def test_every_url_is_the_one_werkzeug_builds(request):
    cached = built(RULES) + built(list(reversed(RULES)))  # a second map: builders from the cache
    request.getfixturevalue("werkzeug_own")
    assert cached == built(RULES) + built(list(reversed(RULES)))
