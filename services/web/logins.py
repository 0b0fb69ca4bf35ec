"""What the web keeps in the DB to trust a browser: the session key and the logged-in sessions.

- The key that signs the session cookie is 32 random bytes made once, by the first web process
  that finds none, and stored in `web_keys`: every web process of a deployment (gunicorn's workers,
  several containers on one PostgreSQL) reads the same one, and it owes nothing to the submit token,
  so a cookie tells nothing about the token.
- A login is a row in `web_logins`, keyed by the SHA-256 of a random id that only the cookie holds.
  The cookie is trusted as logged in only while that row exists, has not expired (`LOGIN_TTL`) and was
  made with the current token (its tag, an HMAC of the token under the session key). Logging out
  deletes the row, so a copy of the cookie taken before is refused after; changing the token ends
  every login; and a forged cookie needs a login id, which even the session key does not give.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from datetime import datetime, timedelta

from flask import Flask
from flask.sessions import SecureCookieSessionInterface
from itsdangerous import URLSafeTimedSerializer
from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from shared.db import Database, WebKeyRow, WebLoginRow, utcnow

log = logging.getLogger(__name__)

SESSION_KEY = "session_key"
LOGIN_TTL = timedelta(hours=12)


class StoredKey:
    """The session key, read (or made) on first use and kept: the app starts while the DB is down,
    and `/healthz` can say so."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._key: bytes | None = None

    def get(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = session_key(self._db)
            return self._key


class StoredKeySessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions under the stored key. While the DB cannot be read, a request
    gets Flask's null session (nothing in it; writing to it fails), as without a key."""

    def __init__(self, key: StoredKey) -> None:
        self.key = key

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer | None:
        try:
            secret = self.key.get()
        except SQLAlchemyError as error:
            log.warning("no session key: the database is unreachable error=%r", error)
            return None
        app.secret_key = secret  # the same bytes every time
        return super().get_signing_serializer(app)


def session_key(db: Database) -> bytes:
    """The deployment's session key, made and stored by the first caller (one winner when several
    processes start at once: the others read the winner's row)."""
    with db.session() as session:
        row = session.get(WebKeyRow, SESSION_KEY)
        if row is not None:
            return bytes.fromhex(row.value)
    try:
        with db.session() as session:
            session.add(WebKeyRow(name=SESSION_KEY, value=secrets.token_hex(32)))
    except IntegrityError:
        pass  # another process stored one first
    with db.session() as session:
        return bytes.fromhex(session.get(WebKeyRow, SESSION_KEY).value)


def token_tag(key: bytes, token: str) -> str:
    return hmac.new(key, b"kernelswarm login\0" + token.encode(), hashlib.sha256).hexdigest()


def _id_hash(login_id: str) -> str:
    return hashlib.sha256(login_id.encode("utf-8", "surrogatepass")).hexdigest()


def start(db: Database, tag: str, now: datetime | None = None) -> str:
    """A new login for the token `tag` names; returns its id (for the cookie). Expired logins go."""
    now = now or utcnow()
    login_id = secrets.token_urlsafe(32)
    with db.session() as session:
        session.execute(delete(WebLoginRow).where(WebLoginRow.expires_at <= now))
        session.add(WebLoginRow(id_hash=_id_hash(login_id), token_tag=tag, created_at=now,
                                expires_at=now + LOGIN_TTL))
    return login_id


def is_live(db: Database, login_id: str, tag: str, now: datetime | None = None) -> bool:
    with db.session() as session:
        row = session.get(WebLoginRow, _id_hash(login_id))
        return (row is not None and row.expires_at > (now or utcnow())
                and hmac.compare_digest(row.token_tag, tag))


def end(db: Database, login_id: str) -> None:
    with db.session() as session:
        session.execute(delete(WebLoginRow).where(WebLoginRow.id_hash == _id_hash(login_id)))
