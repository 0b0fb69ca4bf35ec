"""Issue 25, the web's keys: the session key is random and stored in the DB (never derived from the
token), shared by the web processes of one DB; a login lives in the DB, so logging out ends it
for every copy of the cookie; logging in starts a fresh session with a new CSRF token; weak
submit tokens are refused at start."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from datetime import timedelta

import pytest
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import select, update
from webseed import TOKEN

from services.web import backends, create_app, logins
from services.web.tokens import check_submit_token, new_token, weakness
from shared.db import Database, WebKeyRow, WebLoginRow, utcnow
from shared.errors import UserError
from shared.settings import Settings

COOKIE = "session"


@pytest.fixture
def apps(db, store, tmp_path):
    """`apps(**settings)`: an app on the test's DB (as another web process of the deployment would be)."""
    made = []

    def make(**settings):
        app = create_app(Settings(home=tmp_path, **{"submit_token": TOKEN, **settings}), db, store)
        app.config["TESTING"] = True
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions[backends.EXTENSION].close()


def csrf(client, path: str = "/submit") -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True)).group(1)


def log_in(client) -> None:
    response = client.post("/login", data={"csrf_token": csrf(client, "/login"), "token": TOKEN, "next": "/status"})
    assert response.status_code == 302


def cookie(client) -> str | None:
    found = client.get_cookie(COOKIE)
    return None if found is None else found.value


def is_logged_in(client) -> bool:
    return 'action="/logout"' in client.get("/status").get_data(as_text=True)


def stored_key(db: Database) -> bytes:
    with db.session() as session:
        return bytes.fromhex(session.get(WebKeyRow, logins.SESSION_KEY).value)


def signer(app, key: bytes) -> URLSafeTimedSerializer:
    interface = app.session_interface
    return URLSafeTimedSerializer(key, salt=interface.salt, serializer=interface.serializer,
                                  signer_kwargs={"key_derivation": interface.key_derivation,
                                                 "digest_method": interface.digest_method})


# --- the session key ---------------------------------------------------------------------------------


def test_an_anonymous_cookie_is_signed_with_the_stored_random_key_not_with_the_token(apps, db):
    app = apps()
    client = app.test_client()
    csrf(client)  # the form puts a CSRF token in the session: the anonymous cookie of the issue
    value = cookie(client)
    assert value

    key = stored_key(db)
    assert len(key) == 32
    assert signer(app, key).loads(value)["csrf"]
    # Before: the key was sha256("kernelswarm web session\0" + token); a guessed token no longer checks out.
    derived = hashlib.sha256(b"kernelswarm web session\0" + TOKEN.encode()).digest()
    with pytest.raises(BadSignature):
        signer(app, derived).loads(value)


def test_every_deployment_makes_its_own_key(db, store, tmp_path):
    other_db = Database(f"sqlite:///{tmp_path}/other.db")
    try:
        for database in (db, other_db):
            create_app(Settings(home=tmp_path, submit_token=TOKEN), database, store).test_client().get("/submit")
        assert stored_key(db) != stored_key(other_db)  # the same token, two random keys
    finally:
        other_db.dispose()


def test_web_processes_on_one_db_share_the_key_and_the_logins(apps):
    first, second = apps().test_client(), apps().test_client()
    log_in(first)
    second.set_cookie(COOKIE, cookie(first))
    assert is_logged_in(second)


def test_processes_starting_at_once_agree_on_one_key(db):
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(logins.session_key(db))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 6 and len(set(keys)) == 1
    with db.session() as session:
        assert len(session.scalars(select(WebKeyRow)).all()) == 1


def test_the_app_starts_and_reports_while_the_db_is_unreachable(tmp_path):
    (tmp_path / "adir").mkdir()
    broken = Database(f"sqlite:///{tmp_path}/adir", upgrade=False)
    try:
        client = create_app(Settings(home=tmp_path, submit_token=TOKEN), broken).test_client()
        assert client.get("/healthz").status_code == 503
    finally:
        broken.dispose()


# --- forged and replayed cookies ---------------------------------------------------------------------


def test_a_cookie_signed_with_the_stored_key_but_no_live_login_is_not_logged_in(apps, db):
    """Even with the key (read from the DB), a session cannot be forged: the login id is not stored."""
    app = apps()
    client = app.test_client()
    client.get("/submit")
    forged = signer(app, stored_key(db)).dumps({"authorized": True, "login": secrets.token_urlsafe(32), "csrf": "x"})
    client.set_cookie(COOKIE, forged)
    assert not is_logged_in(client)
    assert client.post("/status/campaigns/1/pause", data={"csrf_token": "x"}).status_code == 401


def test_logout_ends_the_login_for_a_replayed_copy_of_the_cookie(apps, seed, db):
    campaign = seed.campaign([seed.problem("p")])
    client = apps().test_client()
    log_in(client)
    old = cookie(client)
    token = csrf(client)

    response = client.post("/logout", data={"csrf_token": token})
    assert response.status_code == 302
    assert not is_logged_in(client)
    with db.session() as session:
        assert session.scalars(select(WebLoginRow)).all() == []

    client.set_cookie(COOKIE, old)  # the cookie as it was before logging out
    assert not is_logged_in(client)
    refused = client.post(f"/status/campaigns/{campaign}/pause", data={"csrf_token": token})
    assert refused.status_code == 401


def test_logout_clears_the_cookie_session(apps):
    client = apps().test_client()
    log_in(client)
    client.post("/logout", data={"csrf_token": csrf(client)})
    assert logins_in(client) is None


def logins_in(client) -> str | None:
    app = client.application
    value = cookie(client)
    if not value:
        return None
    with app.app_context():
        return signer(app, app.extensions["kernelswarm.auth"].key.get()).loads(value).get("login")


def test_an_expired_login_is_refused(apps, db):
    client = apps().test_client()
    log_in(client)
    with db.session() as session:
        session.execute(update(WebLoginRow).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert not is_logged_in(client)


def test_a_new_token_ends_the_logins_made_with_the_old_one(apps):
    client = apps().test_client()
    log_in(client)
    restarted = apps(submit_token=new_token()).test_client()
    restarted.set_cookie(COOKIE, cookie(client))
    assert not is_logged_in(restarted)


# --- a fresh session at login ------------------------------------------------------------------------


def test_login_rotates_the_csrf_token_and_the_login_id(apps):
    client = apps().test_client()
    before = csrf(client)
    log_in(client)
    after = csrf(client)
    first_login = logins_in(client)
    assert after != before and first_login

    refused = client.post("/logout", data={"csrf_token": before})  # the pre-login token is stale
    assert refused.status_code == 400 and is_logged_in(client)

    client.post("/logout", data={"csrf_token": after})
    log_in(client)
    assert logins_in(client) not in (None, first_login)


def test_the_token_in_a_form_logs_in_with_a_fresh_session_too(apps, seed):
    campaign = seed.campaign([seed.problem("p")])
    client = apps().test_client()
    before = csrf(client)
    response = client.post(f"/status/campaigns/{campaign}/pause", data={"csrf_token": before, "token": TOKEN})
    assert response.status_code == 302 and is_logged_in(client)
    assert csrf(client) != before


# --- the token -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [
    "abc", "s3cret-token", "x" * 31,  # short: the issue guessed a 3-letter token in 0.1 s
    "a" * 64, "ab" * 20, "password" * 4, "0123456789abcdef" * 2,  # long but repeating
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",  # long, 2 symbols
    "correct horse battery staple horse",  # spaces
    "tökén" * 8,  # not ASCII
])
def test_a_weak_token_is_refused_at_start_saying_how_to_make_one(token, db, store, tmp_path):
    with pytest.raises(UserError, match="KERNELSWARM_SUBMIT_TOKEN is too weak") as refused:
        create_app(Settings(home=tmp_path, submit_token=token), db, store)
    assert "kernelswarm token" in str(refused.value) and "secrets.token_urlsafe(32)" in str(refused.value)


def test_random_tokens_pass():
    for _ in range(300):
        for token in (new_token(), secrets.token_hex(16), secrets.token_hex(32), secrets.token_urlsafe(24)):
            assert weakness(token) is None, token
    assert len(new_token()) >= 43 and new_token() != new_token()


def test_no_token_is_allowed_and_turns_submitting_off(client):
    check_submit_token(None)
    check_submit_token("")
    assert client.post("/api/problems", json={}, headers={"Authorization": "Bearer x"}).status_code == 403
