"""The web app: leaderboard, problem pages, submission, status, their JSON API and a health check
(Flask's application factory)."""

from __future__ import annotations

from flask import Flask, abort
from werkzeug.middleware.proxy_fix import ProxyFix

from services.web import (
    auth,
    backends,
    errors,
    filters,
    headers,
    health,
    leaderboard,
    leaderboard_cache,
    problems,
    status,
    submit,
)
from services.web import db as web_db
from services.web.submission import MAX_REQUEST_BYTES
from services.web.tokens import check_submit_token
from shared.db.session import Database
from shared.home import secure_home
from shared.settings import Settings
from shared.store import ObjectStore


def create_app(settings: Settings | None = None, db: Database | None = None,
               store: ObjectStore | None = None) -> Flask:
    """Build the app. Without `settings` they come from the environment; without `db` one is
    opened (and migrated) at `settings.db_url`; without `store` the settings' store is opened on
    first use. A submit token that is set but weak is refused here (UserError), before any request."""
    settings = settings if settings is not None else Settings.from_env()
    check_submit_token(settings.submit_token)
    secure_home(settings)
    app = Flask(__name__)
    app.config["KERNELSWARM_SETTINGS"] = settings
    app.config.update(MAX_CONTENT_LENGTH=MAX_REQUEST_BYTES, MAX_FORM_MEMORY_SIZE=MAX_REQUEST_BYTES)
    db = db if db is not None else Database(settings.db_url)
    web_db.init_app(app, db)
    backends.init_app(app, settings, store)
    leaderboard_cache.init_app(app)
    auth.init_app(app, settings, db)
    filters.init_app(app)
    errors.init_app(app)
    headers.init_app(app)
    if settings.web_trusted_proxies > 0:  # the client's address from their X-Forwarded-For
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=settings.web_trusted_proxies)
    for blueprint in (leaderboard.bp, problems.bp, submit.bp, status.bp, auth.bp, health.bp):
        app.register_blueprint(blueprint)
    app.url_value_preprocessor(_no_nul_in_paths)
    return app


def _no_nul_in_paths(_endpoint: str | None, values: dict | None) -> None:
    """No name or id holds a NUL character: answer 404 before a query that PostgreSQL would refuse."""
    if values and any(isinstance(v, str) and "\x00" in v for v in values.values()):
        abort(404)
