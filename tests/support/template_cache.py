"""Jinja templates compiled once per test process, not once per app.

Each app gets its own Jinja environment, and each environment parses, generates and
compiles a template the first time it renders it: about 3 ms a template, paid again by
every test that renders a page or a problem.  A bytecode cache shared by the process's
environments (every app is built the same way, with the same loader and autoescaping)
lets a later app load the compiled code instead.  Jinja checks each cached entry against
a checksum of the template's source, so an edited template is compiled afresh.
Production builds one app per process and compiles as Jinja does; this is installed by
tests/conftest.py only.
"""

from __future__ import annotations

import flask
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket


class ProcessBytecodeCache(BytecodeCache):
    """Compiled templates in memory, keyed as Jinja keys them (name and file)."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        data = self.stored.get(bucket.key)
        if data is not None:
            bucket.bytecode_from_string(data)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self.stored[bucket.key] = bucket.bytecode_to_string()


CACHE = ProcessBytecodeCache()


def install() -> None:
    flask.Flask.jinja_options = {**flask.Flask.jinja_options, "bytecode_cache": CACHE}
