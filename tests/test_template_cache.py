"""tests/support/template_cache.py: a template compiled once per process renders as Jinja's own."""

from __future__ import annotations

import os

import flask
import jinja2
import pytest

from tests.support import template_cache

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "handlers", "templates")
KIND = {"title": "Conflict", "uri": "/problems/conflict", "status": 422, "error": "Conflict", "retryable": False}
CONTEXT = {"kind": {**KIND, "explanation": "a `key` reused <with> other parameters"}}


def app() -> flask.Flask:
    return flask.Flask("handlers", template_folder=TEMPLATES)


def test_the_cache_is_installed_for_every_app():
    assert app().jinja_env.bytecode_cache is template_cache.CACHE


def test_a_later_app_loads_the_compiled_template_and_renders_as_jinja_does(monkeypatch):
    first = app()
    with first.test_request_context():
        expected = first.jinja_env.get_template("problem_type.html").render(CONTEXT)
    later = app()
    monkeypatch.setattr(later.jinja_env, "compile", lambda *a, **k: pytest.fail("compiled again"))
    with later.test_request_context():
        assert later.jinja_env.get_template("problem_type.html").render(CONTEXT) == expected
    monkeypatch.setattr(flask.Flask, "jinja_options", {})  # Jinja's own path, no cache
    own = app()
    assert own.jinja_env.bytecode_cache is None
    with own.test_request_context():
        assert own.jinja_env.get_template("problem_type.html").render(CONTEXT) == expected


def test_an_edited_template_is_compiled_afresh():
    def render(source: str) -> str:
        loader = jinja2.DictLoader({"edited.html": source})
        env = jinja2.Environment(loader=loader, bytecode_cache=template_cache.CACHE, autoescape=True)
        return env.get_template("edited.html").render(name="<x>")

    assert render("hello {{ name }}") == "hello &lt;x&gt;"
    assert render("bye {{ name }}") == "bye &lt;x&gt;"
