"""The WSGI entry point App Engine (and gunicorn) loads: ``main:app``."""

from handlers import create_app
from handlers.logs import configure_logging

configure_logging()

app = create_app()
