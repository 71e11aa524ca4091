"""How deep JSON nests: the limit every parse of untrusted JSON checks (a request's body, a token's claims)."""

from __future__ import annotations

from typing import Any

# Request bodies nested deeper than this are refused: they parse, but the
# JSON encoders that store and fingerprint them recurse once per level.
MAX_JSON_DEPTH = 100


def nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` (counted without recursion).

    The depth limits are the app's own: how deep ``json`` may parse before a
    RecursionError is the interpreter's, and Python 3.13 parses far deeper than 3.11.
    """
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            return True
        pending.extend(
            (child, depth + 1)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, (dict, list))
        )
    return False
