"""The web service's entry point (`gunicorn services.web.entrypoint:app`, `flask --app
services.web.entrypoint run`): settings and logging from the environment, then the app."""

from __future__ import annotations

import logging

from services.web import create_app
from shared.settings import Settings

settings = Settings.from_env()
logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
app = create_app(settings)
