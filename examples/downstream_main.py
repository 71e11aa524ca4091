"""WSGI entry point of the example downstream service: ``examples.downstream_main:app``."""

from examples.downstream import create_downstream_app

app = create_downstream_app()
