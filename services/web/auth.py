"""Who may change things: the submit token (`KERNELSWARM_SUBMIT_TOKEN`), given as a Bearer header by
API clients or once on the login form by people (the session then holds a login kept in the DB,
`logins.py`), and a CSRF token on every form.

The session cookie is signed with a random key stored in the DB (never derived from the token).
Wrong tokens are counted per client address and refused for a while past a limit (`throttle.py`).
Logging in starts a fresh session (new login id, new CSRF token); logging out ends the login in the
DB, so the old cookie is refused if replayed. Without a token nothing can be submitted or controlled.
"""

from __future__ import annotations

import hmac
import secrets
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from flask import Blueprint, Flask, Request, current_app, g, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response

from services.web import logins, throttle
from services.web.backends import get_settings
from services.web.db import get_db
from shared.db import Database
from shared.errors import UserError
from shared.settings import Settings

SESSION_LOGIN = "login"
SESSION_CSRF = "csrf"
CSRF_FIELD = "csrf_token"
TOKEN_FIELD = "token"
EXTENSION = "kernelswarm.auth"
MAX_NEXT_CHARS = 2048

bp = Blueprint("auth", __name__)


class TokenRefusedError(UserError):
    """No way in with this token now; `headers` go on the response."""

    headers: dict[str, str] = {}


class UnauthorizedError(TokenRefusedError):
    http_status = 401


class TooManyFailuresError(TokenRefusedError):
    http_status = 429

    def __init__(self, retry_after_s: int, limits: throttle.Throttle) -> None:
        super().__init__(f"too many wrong tokens from your address (at most {limits.limit} in "
                         f"{limits.window_s:g} s): try again in {retry_after_s} s")
        self.headers = {"Retry-After": str(retry_after_s)}


class ForbiddenError(UserError):
    http_status = 403


@dataclass(frozen=True)
class Keys:
    key: logins.StoredKey
    submit_token: str | None
    throttle: throttle.Throttle

    def token_tag(self) -> str | None:
        """logins.token_tag of the current token; None: submitting is off."""
        return logins.token_tag(self.key.get(), self.submit_token) if self.submit_token else None


def init_app(app: Flask, settings: Settings, db: Database) -> None:
    """Sessions signed with the key stored in the DB; the token and the throttle's limits."""
    key = logins.StoredKey(db)
    app.session_interface = logins.StoredKeySessionInterface(key)
    app.extensions[EXTENSION] = Keys(key, settings.submit_token, throttle.Throttle(
        settings.token_failures_per_window, settings.token_failure_window_s))
    app.config.update(SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_HTTPONLY=True)
    app.jinja_env.globals.update(csrf_token=csrf_token, logged_in=logged_in, submit_enabled=submit_enabled)


def _keys() -> Keys:
    return current_app.extensions[EXTENSION]


def submit_enabled() -> bool:
    return bool(get_settings().submit_token)


def logged_in() -> bool:
    """The session holds a login that is still in the DB, unexpired, made with the current token
    (looked up once per request)."""
    if "logged_in" not in g:
        login_id = session.get(SESSION_LOGIN)
        tag = _keys().token_tag() if isinstance(login_id, str) else None
        g.logged_in = bool(tag and logins.is_live(get_db(), login_id, tag))
    return g.logged_in


def token_matches(given: str | None) -> bool:
    """Whether `given` is the submit token. A client past the limit of wrong tokens gets
    TooManyFailuresError before its token is compared; every comparison is counted against it
    before it is made (atomically with the check) and given back when the token was right."""
    expected = get_settings().submit_token
    if not expected or not given:
        return False
    keys, client = _keys(), throttle.client_of(request.remote_addr)
    turn = throttle.take_turn(get_db(), client, keys.throttle)  # checked and counted in one step
    if turn.failure_id is None:
        raise TooManyFailuresError(turn.retry_after_s or 1, keys.throttle)
    if hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode()):
        throttle.give_back(get_db(), turn.failure_id)
        return True
    return False


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
    log_in()


def log_in() -> None:
    """A fresh session: whatever the old one held (its CSRF token included) is dropped."""
    session.clear()
    session[SESSION_LOGIN] = logins.start(get_db(), _keys().token_tag())
    session[SESSION_CSRF] = secrets.token_urlsafe(32)
    g.logged_in = True


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
def login() -> str | Response | tuple[str, int] | tuple[str, int, dict[str, str]]:
    next_url = local_path(request.values.get("next")) or url_for("leaderboard.index")
    if request.method == "GET":
        return render_template("auth/login.html", next_url=next_url, error=None)
    check_csrf(request.form)
    try:
        authorize_form(request.form)
    except TokenRefusedError as error:
        page = render_template("auth/login.html", next_url=next_url, error=str(error))
        return page, error.http_status, error.headers
    return redirect(next_url)


@bp.post("/logout")
def logout() -> Response:
    """Ends the login in the DB (a copy of this cookie is refused from now on) and empties the session."""
    check_csrf(request.form)
    login_id = session.get(SESSION_LOGIN)
    if isinstance(login_id, str):
        logins.end(get_db(), login_id)
    session.clear()
    g.logged_in = False
    return redirect(url_for("leaderboard.index"))


def local_path(value: str | None) -> str | None:
    """`value` when it is a path on this site to send a browser back to, else None.

    Browsers drop tabs and newlines inside a URL and read a backslash as `/`, so `/<tab>/evil.example`
    (what `?next=/%09/evil.example` decodes to), `/<newline>/evil.example` and `/<backslash>evil.example`
    all become `//evil.example`, another site. Refused: anything not starting with a single `/`, any
    backslash, control, format or space character, the same once percent-decoded (a proxy or a
    second decoding must not turn it into one), and anything with a scheme or a host.
    """
    if not value or len(value) > MAX_NEXT_CHARS:
        return None
    for text in (value, unquote(value)):
        if not text.startswith("/") or text.startswith("//") or "\\" in text:
            return None
        if any(unicodedata.category(c)[0] in "CZ" for c in text):  # Cc, Cf, Cs, Co, Cn; Zs, Zl, Zp
            return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return None
    return value
