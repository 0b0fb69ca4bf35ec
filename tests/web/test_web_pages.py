"""services.web: the leaderboard page, its JSON API, errors and the health check."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from services.web import create_app
from shared.db.session import Database
from shared.settings import Settings

ENTRY_FIELDS = {
    "name", "op_type", "source_model", "attempts", "passed_attempts", "solved", "tokens", "gpu_seconds",
    "best_attempt_id", "best_latency_ms", "sol_score", "speedup", "speedup_over_baseline", "best_workloads",
    "language", "author", "model", "status", "last_attempt_at", "last_improvement_at",
}


def test_api_leaderboard_shape_and_order(client, seed):
    slow = seed.problem("slow")
    fast = seed.problem("fast", op_type="attention")
    seed.attempt(slow, "PASSED", speedup=1.1, latency_ms=3.0)
    best = seed.attempt(fast, "PASSED", speedup=4.0, latency_ms=0.25, language="cuda", author="w2", minute=1)
    seed.attempt(seed.problem("broken"), "COMPILE_ERROR")

    response = client.get("/api/leaderboard")

    assert response.status_code == 200
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"generated_at", "campaign_id", "summary", "problems"}
    assert body["campaign_id"] is None
    assert [p["name"] for p in body["problems"]] == ["fast", "slow", "broken"]
    first = body["problems"][0]
    assert set(first) == ENTRY_FIELDS
    assert first == {
        "name": "fast", "op_type": "attention", "source_model": None, "attempts": 1, "passed_attempts": 1,
        "solved": True, "tokens": 0, "gpu_seconds": 0.0, "best_attempt_id": best, "best_latency_ms": 0.25, "sol_score": None,
        "speedup": 4.0, "speedup_over_baseline": None, "best_workloads": 2, "language": "cuda", "author": "w2", "model": None,
        "status": "PASSED", "last_attempt_at": "2026-01-01T12:01:00Z", "last_improvement_at": "2026-01-01T12:01:00Z",
    }
    assert body["summary"]["problems"] == 3 and body["summary"]["solved"] == 2
    assert body["problems"][2]["status"] == "COMPILE_ERROR"


def test_api_leaderboard_campaign_filter(client, seed):
    inside, outside = seed.problem("inside"), seed.problem("outside")
    campaign = seed.campaign([inside])
    seed.attempt(inside, "PASSED", speedup=2.0, latency_ms=1.0, campaign_id=campaign)
    seed.attempt(outside, "PASSED", speedup=3.0, latency_ms=1.0)

    body = client.get(f"/api/leaderboard?campaign={campaign}").get_json()

    assert body["campaign_id"] == campaign
    assert [p["name"] for p in body["problems"]] == ["inside"]


@pytest.mark.parametrize("value", ["abc", "-1", "0", "1.5", "²"])
def test_api_bad_campaign_is_a_json_400(client, value):
    response = client.get("/api/leaderboard", query_string={"campaign": value})

    assert response.status_code == 400
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["status"] == 400
    assert "campaign" in body["error"]


def test_api_unknown_campaign_is_a_json_404(client):
    response = client.get("/api/leaderboard?campaign=7")

    assert response.status_code == 404
    assert response.get_json() == {"error": "no campaign 7", "status": 404}


def test_api_unknown_path_is_json(client):
    response = client.get("/api/nothing-here")

    assert response.status_code == 404
    assert response.get_json()["status"] == 404


def test_page_lists_problems_with_their_figures(client, seed):
    seed.attempt(seed.problem("rmsnorm_fp16", op_type="norm"), "PASSED", speedup=3.456, latency_ms=0.0125,
                 language="triton")
    seed.attempt(seed.problem("topk_sampling"), "INCORRECT_NUMERICAL", minute=2)
    seed.problem("never_tried")

    response = client.get("/")

    assert response.status_code == 200
    assert response.mimetype == "text/html"
    html = response.get_data(as_text=True)
    assert 'data-refresh-s="10"' in html
    assert html.index("rmsnorm_fp16") < html.index("never_tried") < html.index("topk_sampling")
    for text in ("3.46x", "triton", "PASSED", "INCORRECT_NUMERICAL", "NO_ATTEMPTS", "1 / 1", "norm"):
        assert text in html
    assert "1 of 3 problems solved" in html


def test_page_shows_the_model_or_a_dash_and_the_author_in_columns_of_their_own(client, seed):
    seed.attempt(seed.problem("by_llm"), "PASSED", speedup=3.0, author="llm-writer", model="gpt-oss-120b")
    seed.attempt(seed.problem("by_tuner"), "PASSED", speedup=2.0, author="kernelswarm-tuner")  # no model

    html = client.get("/").get_data(as_text=True)

    headers = re.findall(r"<th[^>]*>(.*?)</th>", html[html.index('id="leaderboard"'):])
    rows = re.findall(r'<tr data-op="[^"]*">.*?href="/problems/(by_\w+)">.*?</a>(.*?)</tr>', html, re.S)
    cells = {name: re.findall(r"<td>(.*?)</td>", row) for name, row in rows}
    model, author = headers.index("model") - 2, headers.index("author") - 2  # less the rank and the name
    assert (cells["by_llm"][model], cells["by_llm"][author]) == ("gpt-oss-120b", "llm-writer")
    assert (cells["by_tuner"][model], cells["by_tuner"][author]) == ("—", "kernelswarm-tuner")


def test_page_bad_campaign_is_an_html_400(client):
    response = client.get("/?campaign=nope")

    assert response.status_code == 400
    assert response.mimetype == "text/html"
    assert "campaign must be a positive integer" in response.get_data(as_text=True)


def test_healthz(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.get_json() == {"ok": True}


def test_healthz_reports_an_unreachable_database(tmp_path):
    (tmp_path / "adir").mkdir()
    broken = Database(f"sqlite:///{tmp_path}/adir", upgrade=False)  # a directory: SQLite cannot open it
    try:
        response = create_app(Settings(home=tmp_path), broken).test_client().get("/healthz")
    finally:
        broken.dispose()

    assert response.status_code == 503
    assert response.get_json()["ok"] is False


def test_create_app_opens_the_database_from_settings(tmp_path, seed):
    app = create_app(Settings(database_url=seed.db.url))
    try:
        body = app.test_client().get("/api/leaderboard").get_json()
    finally:
        app.extensions["kernelswarm.db"].dispose()
    assert body["problems"] == []


def test_entrypoint_builds_the_app_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELSWARM_DATABASE_URL", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.delitem(sys.modules, "services.web.entrypoint", raising=False)
    entrypoint = importlib.import_module("services.web.entrypoint")
    try:
        assert entrypoint.app.test_client().get("/healthz").get_json() == {"ok": True}
        assert (tmp_path / "env.db").exists()
    finally:
        entrypoint.app.extensions["kernelswarm.db"].dispose()
        sys.modules.pop("services.web.entrypoint", None)
