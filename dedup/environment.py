"""What the library reads of a handler's own process, which has no Settings of the app's.

``DeliverySettings.from_environment`` takes these, so a Cloud Run service or App Engine app is
configured as it is deployed (``--set-env-vars``, ``env_variables:``) without code:

- ``DEDUP_DATABASE``: the Datastore-mode database (dedup.database's rule, the app's too);
- ``DEDUP_LEASE_SECONDS``, ``DEDUP_RETENTION_SECONDS``: a run's lease and how long it is remembered;
- ``DEDUP_HEARTBEAT``: ``true`` (default) or ``false``, whether the lease is renewed while work runs;
- ``DEDUP_PROJECT``, ``DEDUP_LOCATION``: the scope where the deliveries name none.

A value that cannot be read is an ``EnvironmentSettingError`` naming the variable, raised where
the ``Deliveries`` are made (at import, so the process fails to start rather than serve).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from dedup.database import client_database

PRODUCTION_GAE_ENV = "standard"  # App Engine's standard environment sets GAE_ENV to this


class EnvironmentSettingError(ValueError):
    """A DEDUP_* variable whose value cannot be read."""


def environment_database(environ: Mapping[str, str] | None = None) -> str | None:
    """DEDUP_DATABASE of this process, by ``client_database``'s rule (None: the default database)."""
    return client_database(os.environ if environ is None else environ)


def on_app_engine(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs on App Engine's standard environment, whose front end strips
    client-sent X-Appengine-* headers (dev_appserver sets GAE_ENV to localdev)."""
    return (os.environ if environ is None else environ).get("GAE_ENV") == PRODUCTION_GAE_ENV


def _seconds(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise EnvironmentSettingError(f"{name}={value!r}: a number of seconds more than 0 is wanted")
    return seconds


def _switch(name: str, value: str) -> bool:
    folded = value.strip().lower()
    if folded not in ("true", "false"):
        raise EnvironmentSettingError(f"{name}={value!r}: true or false is wanted")
    return folded == "true"


READERS = {
    "DEDUP_LEASE_SECONDS": ("lease_seconds", _seconds),
    "DEDUP_RETENTION_SECONDS": ("retention_seconds", _seconds),
    "DEDUP_HEARTBEAT": ("heartbeat", _switch),
    "DEDUP_PROJECT": ("project", lambda _name, value: value.strip()),
    "DEDUP_LOCATION": ("location", lambda _name, value: value.strip()),
}


def delivery_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``DeliverySettings`` fields the environment sets (those it leaves unset are absent)."""
    source = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name, (field, read) in READERS.items():
        value = source.get(name)
        if value is not None and value.strip():
            found[field] = read(name, value)
    return found
