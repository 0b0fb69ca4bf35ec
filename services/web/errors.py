"""One error handler: a KernelSwarmError is shown with its HTTP status, as JSON under /api/."""

from __future__ import annotations

import logging

from flask import Flask, Response, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from shared.errors import KernelSwarmError

log = logging.getLogger(__name__)


def init_app(app: Flask) -> None:
    app.register_error_handler(KernelSwarmError, render_error)
    app.register_error_handler(HTTPException, render_http_error)


def render_error(error: KernelSwarmError) -> tuple[Response | str, int, dict[str, str]]:
    """With the error's own `headers` when it has some (Retry-After on a 429)."""
    if error.http_status >= 500:
        log.error("request failed path=%s error=%r", request.path, error)
    return *_render(error.http_status, str(error)), getattr(error, "headers", None) or {}


def render_http_error(error: HTTPException) -> Response | tuple[Response | str, int]:
    """Werkzeug's own errors (404 for an unknown path, 405, ...) keep their pages, except under
    /api/ where clients expect JSON."""
    if not _wants_json():
        return error.get_response()
    return _render(error.code or 500, error.description or error.name)


def _render(status: int, message: str) -> tuple[Response | str, int]:
    if _wants_json():
        return jsonify(error=message, status=status), status
    return render_template("error.html", status=status, message=message), status


def _wants_json() -> bool:
    return request.path.startswith("/api/")
