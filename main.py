"""The WSGI entry point App Engine (and gunicorn) loads: ``main:app``."""

import logging

from handlers import create_app

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

app = create_app()
