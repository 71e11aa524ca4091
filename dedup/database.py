"""Which Datastore-mode database holds the ledger: DEDUP_DATABASE, one rule for the app and the CLIs.

A named database lets a project whose ``(default)`` database is in Firestore native mode host the
ledger (``gcloud firestore databases create --database=NAME --type=datastore-mode``).  The app's
NDB client and ``python -m deploy bootstrap`` read the name through ``database_name``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SETTING = "DEDUP_DATABASE"
DEFAULT = "(default)"
# Firestore's database ids: 4 to 63 lowercase letters, digits and hyphens, starting with a letter
# and ending with a letter or digit.
DATABASE_ID = re.compile(r"[a-z][a-z0-9-]{2,61}[a-z0-9]")


class DatabaseNameError(ValueError):
    """A name Firestore would refuse: said before anything is built or asked of Google."""


def database_name(value: str | None) -> str:
    """``value`` (DEDUP_DATABASE or --database) as a database id: ``(default)`` when unset."""
    name = (value or "").strip() or DEFAULT
    if name != DEFAULT and not DATABASE_ID.fullmatch(name):
        raise DatabaseNameError(
            f"{name!r} is not a database id: 4 to 63 lowercase letters, digits and hyphens, starting with a "
            f"letter and ending with a letter or digit, or {DEFAULT}"
        )
    return name


def client_database(environ: Mapping[str, str]) -> str | None:
    """What ``ndb.Client(database=...)`` takes for DEDUP_DATABASE: None for the default database."""
    name = database_name(environ.get(SETTING))
    return None if name == DEFAULT else name
