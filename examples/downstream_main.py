"""WSGI entry point of the example downstream service: ``examples.downstream_main:app``."""

import os

from google.cloud import ndb

from examples.downstream import create_downstream_app
from handlers.logs import configure_logging
from settings import Settings

# The same escaped, one-line-per-record logs as the scheduler target.
configure_logging(Settings.from_environ(os.environ))

# A namespace of its own: a downstream is another service with a Datastore of its own, and under
# make run it shares the app's emulator, where its guard records would show on the app's dashboard.
NAMESPACE = "example-downstream"
app = create_downstream_app(ndb_client=ndb.Client(namespace=NAMESPACE))
