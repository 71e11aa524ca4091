"""WSGI entry point of the example downstream service: ``examples.downstream_main:app``."""

from examples.downstream import create_downstream_app
from handlers.logs import configure_logging

configure_logging()  # the same escaped, one-line-per-record logs as the scheduler target

app = create_downstream_app()
