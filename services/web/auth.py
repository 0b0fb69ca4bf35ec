"""Who may change things: the submit token (`KERNELSWARM_SUBMIT_TOKEN`), given as a Bearer header by
API clients or once on the login form by people (the session then remembers it), and a CSRF token
on every form.

The session cookie is signed with a key derived from the submit token, so every web process of a
deployment shares it and changing the token logs everyone out. Without a token nothing can be
submitted or controlled.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from flask import Blueprint, Flask, Request, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response

from services.web.backends import get_settings
from shared.errors import UserError

SESSION_AUTHORIZED = "authorized"
SESSION_CSRF = "csrf"
CSRF_FIELD = "csrf_token"
TOKEN_FIELD = "token"

bp = Blueprint("auth", __name__)


class UnauthorizedError(UserError):
    http_status = 401


class ForbiddenError(UserError):
    http_status = 403


def init_app(app: Flask, submit_token: str | None) -> None:
    if submit_token:
        app.secret_key = hashlib.sha256(b"kernelswarm web session\0" + submit_token.encode()).digest()
    else:
        app.secret_key = secrets.token_bytes(32)
    app.config.update(SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_HTTPONLY=True)
    app.jinja_env.globals.update(csrf_token=csrf_token, logged_in=logged_in, submit_enabled=submit_enabled)


def submit_enabled() -> bool:
    return bool(get_settings().submit_token)


def logged_in() -> bool:
    return submit_enabled() and session.get(SESSION_AUTHORIZED) is True


def token_matches(given: str | None) -> bool:
    expected = get_settings().submit_token
    if not expected or not given:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def require_submit_enabled() -> None:
    if not submit_enabled():
        raise ForbiddenError("submitting and campaign controls are off: the server has no KERNELSWARM_SUBMIT_TOKEN")


def require_bearer(req: Request) -> None:
    """API calls: `Authorization: Bearer <token>`. No cookies count, so no CSRF is needed."""
    require_submit_enabled()
    scheme, _, given = (req.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token_matches(given.strip()):
        raise UnauthorizedError("missing or wrong token: send `Authorization: Bearer <KERNELSWARM_SUBMIT_TOKEN>`")


def authorize_form(form) -> None:
    """Forms: a logged-in session, or the token in the form (which logs the session in)."""
    require_submit_enabled()
    if logged_in():
        return
    if not token_matches(form.get(TOKEN_FIELD)):
        raise UnauthorizedError("wrong or missing token")
    session[SESSION_AUTHORIZED] = True


def csrf_token() -> str:
    """The session's CSRF token, made on first use (templates call it for every form)."""
    if SESSION_CSRF not in session:
        session[SESSION_CSRF] = secrets.token_urlsafe(32)
    return session[SESSION_CSRF]


def check_csrf(form) -> None:
    expected, given = session.get(SESSION_CSRF), form.get(CSRF_FIELD)
    if not expected or not given or not hmac.compare_digest(str(given).encode(), str(expected).encode()):
        raise UserError("the form's CSRF token is missing or stale: reload the page and submit again")


@bp.route("/login", methods=["GET", "POST"])
def login() -> str | Response | tuple[str, int]:
    next_url = _local_path(request.values.get("next"))
    if request.method == "GET":
        return render_template("auth/login.html", next_url=next_url, error=None)
    check_csrf(request.form)
    try:
        authorize_form(request.form)
    except UnauthorizedError as error:
        return render_template("auth/login.html", next_url=next_url, error=str(error)), error.http_status
    return redirect(next_url)


@bp.post("/logout")
def logout() -> Response:
    check_csrf(request.form)
    session.pop(SESSION_AUTHORIZED, None)
    return redirect(url_for("leaderboard.index"))


def _local_path(value: str | None) -> str:
    """Only a path on this site (no `//host`, no scheme) is a place to go back to."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return url_for("leaderboard.index")
