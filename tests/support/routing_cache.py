"""Werkzeug's URL builders compiled once per test process, not once per app.

The fast tier builds about a thousand apps, and werkzeug compiles two builder functions
per URL rule per app through ``ast`` and ``compile()``: 12 ms an app, a tenth of the
tier's CPU.  A builder's code depends only on the rule's parsed trace (its ``self`` is
an argument, bound afterwards), so for rules without defaults one compiled function
serves every app.  Rules with defaults fold converter output into the code and are
compiled as werkzeug does.  Production builds one app per process and keeps werkzeug's
own path; this is installed by tests/conftest.py only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.routing.rules import Rule

_original = Rule._compile_builder
_compiled: dict[tuple[Any, ...], Callable[..., tuple[str, str]]] = {}


def _compile_builder(self: Rule, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
    if self.defaults:
        return _original(self, append_unknown)
    key = (self.rule, tuple(self._trace), append_unknown)
    builder = _compiled.get(key)
    if builder is None:
        builder = _compiled[key] = _original(self, append_unknown)
    return builder


def install() -> None:
    Rule._compile_builder = _compile_builder  # type: ignore[method-assign]
