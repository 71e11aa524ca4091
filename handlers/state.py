"""What every request reads: the app's state (``service.state.AppState``) and who is asking.

Its own module, so that blueprints read them without importing the app factory
(``handlers/__init__.py``), which imports the blueprints.
"""

from __future__ import annotations

from typing import cast

from flask import current_app, g

from handlers.access import Principal, Role
from service.state import AppState as AppState  # handlers import it from here too (create_app)


def app_state() -> AppState:
    return cast(AppState, current_app.extensions["dedup"])


def current_principal() -> Principal:
    """Who the gate admitted this request as (every view runs after it)."""
    return cast(Principal, g.principal)


def may(role: Role) -> bool:
    """Whether this request's principal has ``role`` (what a page offers, e.g. buttons for operators)."""
    return role in g.get("roles", frozenset())
