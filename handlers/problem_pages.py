"""``/problems/<slug>``: the documentation a problem's ``type`` URI dereferences to.

A blueprint apart from ``handlers.problems`` (which every handler uses to build its
errors), so that building an error never imports a view.  A host app of the guard
serves the pages with ``app.register_blueprint(problem_pages.blueprint)``.
"""

from __future__ import annotations

from flask import Blueprint, render_template
from werkzeug.exceptions import NotFound

from handlers.access import Role, requires
from handlers.problems import TYPE_PREFIX, TYPES_BY_SLUG

blueprint = Blueprint("problem_pages", __name__, template_folder="templates")


@blueprint.get(TYPE_PREFIX + "<slug>", provide_automatic_options=False)
@requires(Role.VIEW)
def problem_type_page(slug: str) -> str:
    """A problem type's documentation: what its ``type`` URI dereferences to."""
    kind = TYPES_BY_SLUG.get(slug)
    if kind is None:
        raise NotFound(f"no problem type {slug!r}; the types are listed in docs/problems.md")
    return render_template("problem_type.html", kind=kind)
