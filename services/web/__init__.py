"""The web app: the leaderboard page, its JSON API and a health check (Flask's application factory)."""

from __future__ import annotations

from flask import Flask

from services.web import db as web_db
from services.web import errors, health, leaderboard
from shared.db.session import Database
from shared.settings import Settings


def create_app(settings: Settings | None = None, db: Database | None = None) -> Flask:
    """Build the app. Without `settings` they come from the environment; without `db` one is
    opened (and migrated) at `settings.db_url`."""
    settings = settings if settings is not None else Settings.from_env()
    app = Flask(__name__)
    app.config["KERNELSWARM_SETTINGS"] = settings
    web_db.init_app(app, db if db is not None else Database(settings.db_url))
    errors.init_app(app)
    app.register_blueprint(leaderboard.bp)
    app.register_blueprint(health.bp)
    return app
