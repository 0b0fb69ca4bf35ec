"""Issue 25, the web's guards: wrong tokens throttled per client address (429 with Retry-After),
the login's `next` checked as a local path, security headers on every response, no inline script or
style for the policy to block, and no software version in the `Server` header."""

from __future__ import annotations

import http.client
import re
import threading
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select, update
from webdemo import seed_demo
from webseed import TOKEN
from werkzeug.serving import make_server as werkzeug_make_server

from kernelswarm.launcher import WebServer, free_port
from services.web import backends, create_app, throttle
from services.web.auth import local_path
from services.web.headers import SECURITY_HEADERS
from services.web.serving import SERVER_HEADER, make_server
from shared.db import TokenFailureRow
from shared.errors import UserError
from shared.settings import Settings

LIMIT, WINDOW_S = 3, 300.0
ELSEWHERE = {"REMOTE_ADDR": "192.0.2.7"}


@pytest.fixture
def web(make_client, seed):
    return make_client(submit_token=TOKEN, token_failures_per_window=LIMIT, token_failure_window_s=WINDOW_S)


def csrf(client, path: str = "/login") -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True)).group(1)


def login(client, token: str, **extra):
    return client.post("/login", data={"csrf_token": csrf(client), "token": token}, **extra)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- failed tokens -----------------------------------------------------------------------------------


def test_wrong_tokens_past_the_limit_get_429_with_retry_after_even_the_right_one(web, seed):
    campaign = seed.campaign([seed.problem("p")])
    for _ in range(LIMIT):
        assert login(web, "wrong-" + TOKEN).status_code == 401

    blocked = login(web, TOKEN)  # the right token too: a 429 that let it through would be an oracle
    assert blocked.status_code == 429
    assert 0 < int(blocked.headers["Retry-After"]) <= WINDOW_S
    assert "too many wrong tokens" in blocked.get_data(as_text=True)

    api = web.post(f"/api/campaigns/{campaign}/pause", headers=bearer(TOKEN))
    assert api.status_code == 429 and "Retry-After" in api.headers
    assert "too many wrong tokens" in api.get_json()["error"]
    form = web.post("/submit", data={"csrf_token": csrf(web, "/submit"), "token": TOKEN, "definition": "{}",
                                     "workloads": ""})
    assert form.status_code == 429 and "Retry-After" in form.headers
    assert 'id="errors-token"><li>too many wrong tokens' in form.get_data(as_text=True)

    other = web.post(f"/api/campaigns/{campaign}/pause", headers=bearer(TOKEN), environ_base=ELSEWHERE)
    assert other.status_code == 200  # another address is not held back


def test_the_api_counts_with_the_forms(web, seed):
    campaign = seed.campaign([seed.problem("p")])
    for _ in range(LIMIT):
        assert web.post(f"/api/campaigns/{campaign}/pause", headers=bearer("nope")).status_code == 401
    assert login(web, TOKEN).status_code == 429


def test_missing_tokens_are_not_counted(web, seed):
    campaign = seed.campaign([seed.problem("p")])
    for _ in range(LIMIT + 2):
        assert web.post(f"/api/campaigns/{campaign}/pause").status_code == 401
        assert login(web, "").status_code == 401
    assert login(web, TOKEN).status_code == 302


def test_failures_older_than_the_window_no_longer_count(web, db):
    for _ in range(LIMIT):
        login(web, "wrong")
    assert login(web, TOKEN).status_code == 429
    with db.session() as session:
        session.execute(update(TokenFailureRow).values(
            failed_at=TokenFailureRow.failed_at - timedelta(seconds=WINDOW_S + 1)))
    assert login(web, TOKEN).status_code == 302


def test_web_processes_on_one_db_count_together(make_client, web):
    other = make_client(submit_token=TOKEN, token_failures_per_window=LIMIT, token_failure_window_s=WINDOW_S)
    for client in (web, other, web):
        login(client, "wrong")
    assert login(other, TOKEN).status_code == 429


def test_retry_after_is_when_the_oldest_counted_failure_leaves_the_window(db):
    limits = throttle.Throttle(limit=3, window_s=300)
    t0 = datetime(2026, 12, 5, 9, 0, 0)
    for seconds in (0, 10, 20):
        assert throttle.retry_after_s(db, "192.0.2.1", limits, now=t0 + timedelta(seconds=seconds)) is None
        throttle.record_failure(db, "192.0.2.1", limits, now=t0 + timedelta(seconds=seconds))
    assert throttle.retry_after_s(db, "192.0.2.1", limits, now=t0 + timedelta(seconds=30)) == 270
    assert throttle.retry_after_s(db, "192.0.2.2", limits, now=t0 + timedelta(seconds=30)) is None
    assert throttle.retry_after_s(db, "192.0.2.1", limits, now=t0 + timedelta(seconds=300)) is None  # first one out
    throttle.record_failure(db, "192.0.2.9", limits, now=t0 + timedelta(seconds=900))
    with db.session() as session:  # old failures are dropped as new ones come
        assert session.scalar(select(func.count()).select_from(TokenFailureRow)) == 1


@pytest.mark.parametrize(("address", "client"), [
    ("203.0.113.9", "203.0.113.9"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),  # the same /64: one client
    ("::ffff:203.0.113.9", "203.0.113.9"),
    (None, "unknown"),
])
def test_clients_are_counted_by_address_and_ipv6_by_64(address, client):
    assert throttle.client_of(address) == client


def test_x_forwarded_for_counts_only_behind_a_trusted_proxy(make_client):
    direct = make_client(submit_token=TOKEN, token_failures_per_window=LIMIT)
    for n in range(LIMIT):  # a spoofed header does not make a new client
        login(direct, "wrong", headers={"X-Forwarded-For": f"198.51.100.{n}"})
    assert login(direct, TOKEN, headers={"X-Forwarded-For": "198.51.100.99"}).status_code == 429

    proxied = make_client(submit_token=TOKEN, token_failures_per_window=LIMIT, web_trusted_proxies=1)
    for _ in range(LIMIT):
        login(proxied, "wrong", headers={"X-Forwarded-For": "198.51.100.1"}, environ_base=ELSEWHERE)
    assert login(proxied, TOKEN, headers={"X-Forwarded-For": "198.51.100.1"},
                 environ_base=ELSEWHERE).status_code == 429
    assert login(proxied, TOKEN, headers={"X-Forwarded-For": "198.51.100.2"},
                 environ_base=ELSEWHERE).status_code == 302


# --- the redirect after login ------------------------------------------------------------------------


@pytest.mark.parametrize("target", [
    "//evil.example", "//evil.example/x", "///evil.example", "/\\evil.example", "\\\\evil.example",
    "/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "/%09/evil.example", "/%0a/evil.example",
    "/%2F/evil.example", "/%5Cevil.example", "/\x00", "/\x7f/evil.example", "/\u200b/evil.example",
    "/ /evil.example", " /x", "/problems/a%20b", "https://evil.example/", "javascript:alert(1)", "evil.example", "http:/evil.example",
    "", None, "/" + "a" * 3000,
])
def test_next_refuses_what_is_not_a_local_path(target):
    assert local_path(target) is None


@pytest.mark.parametrize("target", ["/", "/submit", "/status?campaign=2", "/problems/gemm_1#attempt-3",
                                    "/problems/caf%C3%A9"])
def test_next_keeps_local_paths(target):
    assert local_path(target) == target


@pytest.mark.parametrize("query", ["/%09/evil.example", "//evil.example", "/%5C/evil.example", "/%0d%0a/evil.example",
                                   "https://evil.example", "/%2509/evil.example"])
def test_login_never_redirects_off_the_site(web, query):
    """The issue's case: `POST /login?next=/%09/evil.example` went to `//evil.example`."""
    response = web.post(f"/login?next={query}", data={"csrf_token": csrf(web), "token": TOKEN})
    assert response.status_code == 302 and response.headers["Location"] == "/"
    page = web.get(f"/login?next={query}").get_data(as_text=True)
    assert 'name="next" value="/"' in page


def test_login_goes_back_to_a_local_path(web):
    response = web.post("/login?next=/status", data={"csrf_token": csrf(web), "token": TOKEN})
    assert response.headers["Location"] == "/status"


# --- headers ------------------------------------------------------------------------------------------


@pytest.fixture
def demo_client(make_client, db, store):
    demo = seed_demo(db, store, attempts_per_problem=6)
    return make_client(submit_token=TOKEN), demo


def test_every_kind_of_response_carries_the_security_headers(demo_client):
    client, demo = demo_client
    responses = {
        "page": client.get("/"), "problem": client.get(f"/problems/{demo.problems[0]}"),
        "json": client.get("/api/leaderboard"), "static": client.get("/static/style.css"),
        "health": client.get("/healthz"), "404": client.get("/nowhere"), "api 404": client.get("/api/problems/none"),
        "405": client.put("/submit"), "401": client.post("/api/problems", headers=bearer("wrong")),
        "400": client.post("/login", data={}),
        "redirect": client.post("/login", data={"csrf_token": csrf(client), "token": TOKEN}),
    }
    assert [responses[n].status_code for n in ("404", "405", "401", "400", "redirect")] == [404, 405, 401, 400, 302]
    for name, response in responses.items():
        response.close()
        for header, value in SECURITY_HEADERS.items():
            assert response.headers.get(header) == value, (name, header)
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert SECURITY_HEADERS["X-Frame-Options"] == "DENY" and SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline script"),
    (re.compile(r"\sstyle\s*=", re.I), "a style attribute"),
    (re.compile(r"<style\b", re.I), "a style element"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "an event handler attribute"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


def test_no_page_holds_inline_code_the_policy_would_block(demo_client, seed):
    """With scores, a chart, sources, traces, forms, a login and an error: what the policy blocks
    must not be in the pages (the Chromium test checks the same in a browser)."""
    client, demo = demo_client
    campaign = seed.campaign([seed.problem("other")])
    pages = {path: client.get(path) for path in ("/", f"/problems/{demo.problems[0]}", "/submit", "/status",
                                                 "/login", f"/?campaign={campaign}", "/problems/none")}
    client.post("/login", data={"csrf_token": csrf(client), "token": TOKEN})
    pages["/status (logged in)"] = client.get("/status")
    assert 'class="bar"' in pages["/"].get_data(as_text=True)
    assert "<svg" in pages[f"/problems/{demo.problems[0]}"].get_data(as_text=True)
    for path, response in pages.items():
        html = response.get_data(as_text=True)
        for pattern, what in INLINE:
            assert not pattern.search(html), (path, what, pattern.search(html))


# --- the Server header --------------------------------------------------------------------------------


def server_header(server) -> str:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.socket.getsockname()[1], timeout=10)
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        connection.close()
        return response.getheader("Server")
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


def test_the_server_header_names_no_version(make_client):
    app = make_client().application
    assert "Werkzeug/" in server_header(werkzeug_make_server("127.0.0.1", 0, app, threaded=True))  # before
    header = server_header(make_server("127.0.0.1", 0, app))
    assert header == SERVER_HEADER and not re.search(r"\d|Werkzeug|Python", header)


def test_kernelswarm_up_serves_the_web_without_versions(tmp_path):
    """`up`'s web server (kernelswarm/launcher.py), as it starts it."""
    web = WebServer(Settings(home=tmp_path), free_port())
    try:
        connection = http.client.HTTPConnection("127.0.0.1", web.server.socket.getsockname()[1], timeout=10)
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        connection.close()
        assert response.getheader("Server") == SERVER_HEADER
        assert response.getheader("X-Frame-Options") == "DENY"
    finally:
        web.stop()
        web.server.server_close()
        web.server.app.extensions[backends.EXTENSION].close()
        web.server.app.extensions["kernelswarm.db"].dispose()


def test_the_app_refuses_a_weak_token_before_opening_anything(tmp_path):
    with pytest.raises(UserError, match="too weak"):
        create_app(Settings(home=tmp_path, submit_token="short"))
    assert not (tmp_path / "kernelswarm.db").exists()
