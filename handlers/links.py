"""The links a page builds with a query: the path from ``url_for``, the query encoded apart.

A page that carries something of its own query into a link (the queued run page's refresh,
the history's next page and bulk run, the bulk run's way back) names each parameter it
carries.  Built here, no query name ever reaches ``url_for`` as a keyword: one the route's path
takes (``run_id``) or ``url_for`` takes for itself (``endpoint``, ``_method``, ``_external``,
``_anchor``, ``_scheme``) would otherwise be a TypeError or a BuildError, a 500.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from flask import url_for

# What url_for leaves unescaped in a query (werkzeug's, after the WHATWG URL standard): the
# links read as they did when url_for encoded their queries.
QUERY_SAFE = "!$'()*,/:;?@"


def link(endpoint: str, path: Mapping[str, str], query: Mapping[str, object]) -> str:
    """``endpoint``'s URL for the ``path`` values, with ``query`` (None values left out) after it."""
    values: dict[str, Any] = dict(path)  # each a path parameter's, by the caller's choice
    base = url_for(endpoint, **values)
    pairs = [(name, str(value)) for name, value in query.items() if value is not None]
    return f"{base}?{urllib.parse.urlencode(pairs, safe=QUERY_SAFE)}" if pairs else base
