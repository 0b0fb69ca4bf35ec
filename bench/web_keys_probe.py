"""Issue 25's web-key attacks, tried against the checkout on PYTHONPATH: one line per case, what an
attacker or operator sees. Run it on a checkout from before the fix and on one after to fill the
before/after table in docs/results/hardening.md ("Web keys (issue 25)"):

    PYTHONPATH=<checkout> python bench/web_keys_probe.py

It uses only what both versions have (create_app, Settings, the test client, kernelswarm up's
WebServer), a temporary SQLite DB and no network beyond loopback.
"""

from __future__ import annotations

import hashlib
import http.client
import itertools
import re
import secrets
import string
import sys
import tempfile
import time
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer

from kernelswarm.launcher import WebServer, free_port
from services.web import create_app
from shared.db.session import Database
from shared.settings import Settings

STRONG = secrets.token_urlsafe(32)
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy")


def csrf(client, path: str = "/login") -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True)).group(1)


def app_on(folder: Path, token: str):
    app = create_app(Settings(home=folder, submit_token=token), Database(f"sqlite:///{folder}/probe.db"))
    return app, app.test_client()


def offline_guess(folder: Path) -> str:
    """An anonymous cookie, then every 3-letter token tried offline against its signature with the
    old derivation (sha256 of a fixed prefix and the token)."""
    try:
        app, client = app_on(folder / "guess", "kqz")
    except Exception as error:  # noqa: BLE001 - the new code refuses the weak token at start
        app, client = app_on(folder / "guess2", STRONG)
        refused = f"weak token refused at start ({type(error).__name__})"
    else:
        refused = None
    csrf(client, "/submit")
    cookie = client.get_cookie("session").value
    interface = app.session_interface
    started = time.perf_counter()
    candidates = ["".join(c) for c in itertools.product(string.ascii_lowercase, repeat=3)]
    for token in [*candidates, STRONG]:
        key = hashlib.sha256(b"kernelswarm web session\0" + token.encode()).digest()
        serializer = URLSafeTimedSerializer(key, salt=interface.salt, serializer=interface.serializer,
                                            signer_kwargs={"key_derivation": interface.key_derivation,
                                                           "digest_method": interface.digest_method})
        try:
            serializer.loads(cookie)
        except BadSignature:
            continue
        found = "the strong token" if token == STRONG else repr(token)
        return f"token {found} confirmed offline from one anonymous cookie in {time.perf_counter() - started:.3f} s"
    return (f"{refused}; " if refused else "") + (
        f"no token (the {len(candidates)} 3-letter ones and the real one) checks the cookie's signature")


def weak_token(folder: Path) -> str:
    try:
        app_on(folder / "weak", "abc")
    except Exception as error:  # noqa: BLE001
        return f"refused at start: {str(error)[:90]}..."
    return "token 'abc' accepted without a word"


def throttling(folder: Path) -> str:
    _, client = app_on(folder / "throttle", STRONG)
    codes = [client.post("/login", data={"csrf_token": csrf(client), "token": f"guess-{n}"}).status_code
             for n in range(12)]
    right = client.post("/login", data={"csrf_token": csrf(client), "token": STRONG})
    return (f"12 wrong tokens: {' '.join(map(str, codes))}; then the right one: {right.status_code}"
            f" Retry-After={right.headers.get('Retry-After')}")


def redirect(folder: Path) -> str:
    _, client = app_on(folder / "next", STRONG)
    response = client.post("/login?next=/%09/evil.example", data={"csrf_token": csrf(client), "token": STRONG})
    location = response.headers.get("Location")
    return f"POST /login?next=/%09/evil.example -> {response.status_code} Location: {location!r}"


def logout(folder: Path) -> str:
    _, client = app_on(folder / "logout", STRONG)
    client.post("/login", data={"csrf_token": csrf(client), "token": STRONG})
    old = client.get_cookie("session").value
    client.post("/logout", data={"csrf_token": csrf(client, "/submit")})
    client.set_cookie("session", old)
    logged_in = 'action="/logout"' in client.get("/status").get_data(as_text=True)
    return "the cookie from before logout still logged in" if logged_in else "the cookie from before logout is refused"


def headers_and_server(folder: Path) -> tuple[str, str]:
    web = WebServer(Settings(home=folder / "served"), free_port())
    try:
        connection = http.client.HTTPConnection("127.0.0.1", web.server.socket.getsockname()[1], timeout=10)
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
        connection.close()
    finally:
        web.stop()
    present = [h for h in HEADERS if response.getheader(h)]
    missing = [h for h in HEADERS if not response.getheader(h)]
    return (f"present: {', '.join(present) or 'none'}; missing: {', '.join(missing) or 'none'}",
            f"Server: {response.getheader('Server')}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="web-keys-probe-") as tmp:
        folder = Path(tmp)
        headers, server = headers_and_server(folder)
        for name, result in (("session key", offline_guess(folder)), ("weak token", weak_token(folder)),
                             ("failed tokens", throttling(folder)), ("next redirect", redirect(folder)),
                             ("logout", logout(folder)), ("security headers", headers), ("Server header", server)):
            print(f"{name:17} {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
