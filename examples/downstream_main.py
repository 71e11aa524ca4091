"""WSGI entry point of the example downstream service: ``examples.downstream_main:app``."""

import os

from examples.downstream import create_downstream_app
from handlers.logs import configure_logging
from settings import Settings

# The same escaped, one-line-per-record logs as the scheduler target.
configure_logging(Settings.from_environ(os.environ))

app = create_downstream_app()
