"""The web service's entry point (`gunicorn services.web.entrypoint:app`, `flask --app
services.web.entrypoint run`): settings and logging from the environment, then the app. A weak
submit token stops it here, with the reason and what to do as the last line of the log."""

from __future__ import annotations

import logging

from services.web import create_app
from shared.errors import UserError
from shared.settings import Settings

settings = Settings.from_env()
logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
try:
    app = create_app(settings)
except UserError as error:
    logging.getLogger(__name__).critical("the web cannot start: %s", error)
    raise
