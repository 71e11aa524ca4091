"""The WSGI entry point App Engine (and gunicorn) loads: ``main:app``."""

import os

from handlers import create_app
from handlers.logs import configure_logging
from settings import Settings

# The environment, read once: the logs' format and every setting the app holds.
settings = Settings.from_environ(os.environ)
configure_logging(settings)

app = create_app(settings=settings)
