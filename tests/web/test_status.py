"""The status page and API (queues in a real redis-server, throughput, errors, campaigns) and the
campaign controls behind the token."""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timedelta, timezone

import pytest
import redis
from webseed import TOKEN

from services.web import status
from services.web.status_data import SupervisedProcess
from shared.celery_app import PLAN_TICK
from shared.db import CampaignRow, utcnow
from shared.endpoints import record_endpoint_error
from shared.errors import EndpointError, EndpointUnavailable, EvaluatorFault
from shared.health import UNHEALTHY_AFTER, record_fault


@pytest.fixture
def web(make_client, redis_url):
    return make_client(submit_token=TOKEN, redis_url=redis_url)


@pytest.fixture
def queues(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def csrf(client) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get("/submit").get_data(as_text=True)).group(1)


def login(client) -> None:
    client.post("/login", data={"csrf_token": csrf(client), "token": TOKEN})


def test_api_status_reports_queues_throughput_errors_and_campaigns(web, seed, queues):
    p = seed.problem("softmax")
    campaign = seed.campaign([p], name="nightly", device="h200")
    now = utcnow()
    for minutes, status in ((5, "PASSED"), (20, "PASSED"), (30, "COMPILE_ERROR"), (180, "TIMEOUT")):
        seed.attempt(p, status, finished_at=now - timedelta(minutes=minutes), worker="writer-host",
                     evaluator="evaluator@gpu-1",
                     message=None if status == "PASSED" else f"{status} detail", campaign_id=campaign)
    seed.attempt(p, "RUNNING")
    queues.rpush("evaluate", b"x", b"y")
    queues.rpush("write", b"z")

    body = web.get("/api/status").get_json()

    assert body["redis_error"] is None
    assert {q["name"]: q["depth"] for q in body["queues"]} == {"plan": 0, "write": 1, "evaluate": 2,
                                                               "evaluate.h200": 0}
    assert body["workers_online"] == []  # none started: nobody answers the ping
    assert body["throughput"] == {"finished_last_hour": 3, "passed_last_hour": 2, "finished_last_24h": 4,
                                  "in_flight": 1}
    assert [e["status"] for e in body["recent_errors"]] == ["COMPILE_ERROR", "TIMEOUT"]
    assert body["recent_errors"][0]["problem"] == "softmax"
    assert body["recent_errors"][0]["message"] == "COMPILE_ERROR detail"
    # by the evaluator that ran them, not the writer's host
    assert [(e["worker"], e["attempts"]) for e in body["recent_evaluators"]] == [("evaluator@gpu-1", 1)]
    [state] = body["campaigns"]
    assert (state["id"], state["name"], state["status"], state["problems"], state["attempts"]) == (
        campaign, "nightly", "RUNNING", 1, 4)


def test_status_page(web, seed):
    seed.campaign([seed.problem("p")], name="nightly")
    html = web.get("/status").get_data(as_text=True)

    for heading in ("Queues", "Throughput", "Online", "Campaigns", "Recent errors"):
        assert f">{heading}<" in html
    assert "No worker answered a ping." in html
    assert "log in to pause" in html  # no controls before logging in
    login(web)
    assert 'id="pause-1"' in web.get("/status").get_data(as_text=True)


def test_an_evaluator_busy_with_an_attempt_is_listed_though_it_answers_no_ping(web, seed, queues):
    """A `--pool solo` evaluator answers no ping while it evaluates: the DB's RUNNING attempts name it."""
    p = seed.problem("softmax")
    started = utcnow() - timedelta(minutes=3)
    running = seed.attempt(p, "RUNNING", evaluator="evaluator@gpu-1", started_at=started)
    seed.attempt(p, "PENDING")  # not taken yet: held by no evaluator

    body = web.get("/api/status").get_json()
    assert body["workers_online"] == []  # nobody answers the ping
    [busy] = body["busy_evaluators"]
    assert (busy["name"], busy["attempt_id"], busy["problem"], busy["device"]) == (
        "evaluator@gpu-1", running, "softmax", "cpu")
    assert datetime.fromisoformat(busy["started_at"]) == started.replace(tzinfo=timezone.utc)

    html = web.get("/status").get_data(as_text=True)
    workers = re.search(r'<ul id="workers">(.*?)</ul>', html, re.S).group(1)
    assert "evaluator@gpu-1" in workers and "evaluator, busy" in workers and f"#attempt-{running}" in workers
    assert "No worker answered a ping." not in html


def test_without_redis_the_status_says_so(make_client):
    client = make_client()
    body = client.get("/api/status").get_json()
    assert body["queues"] is None and body["workers_online"] is None
    assert "no Redis configured" in body["redis_error"]
    assert client.get("/status").status_code == 200


def test_the_processes_of_kernelswarm_up_and_their_restarts_are_shown_when_up_serves_the_web(make_client):
    client = make_client(submit_token=TOKEN)
    assert client.get("/api/status").get_json()["processes"] is None  # not under `up`: nothing to show
    assert 'id="processes"' not in client.get("/status").get_data(as_text=True)

    processes = [SupervisedProcess(name="redis", pid=4321, restarts=1, last_exit="was killed by SIGKILL"),
                 SupervisedProcess(name="evaluator", pid=None, restarts=0, last_exit="exited with code 1")]
    status.show_processes(client.application, lambda: processes)

    login(client)  # pids to a logged-in user only (tests/attacks/test_faults.py)
    assert client.get("/api/status").get_json()["processes"] == [p.model_dump() for p in processes]
    html = client.get("/status").get_data(as_text=True)
    assert 'id="processes"' in html and "was killed by SIGKILL" in html and "4321" in html


def test_pause_then_resume_sends_a_planner_tick(web, seed, db, queues):
    campaign = seed.campaign([seed.problem("p")])
    login(web)

    response = web.post(f"/status/campaigns/{campaign}/pause", data={"csrf_token": csrf(web)})
    assert response.status_code == 302
    assert f"campaign {campaign} is PAUSED" in web.get("/status").get_data(as_text=True)
    assert _status(db, campaign) == "PAUSED"
    assert queues.llen("plan") == 0

    web.post(f"/status/campaigns/{campaign}/resume", data={"csrf_token": csrf(web)})
    assert _status(db, campaign) == "RUNNING"
    [message] = [json.loads(m) for m in queues.lrange("plan", 0, -1)]
    assert message["headers"]["task"] == PLAN_TICK
    assert json.loads(base64.b64decode(message["body"]))[0] == [campaign]


def test_controls_need_login_and_csrf(web, seed, db):
    campaign = seed.campaign([seed.problem("p")])
    assert web.post(f"/status/campaigns/{campaign}/pause", data={"csrf_token": csrf(web)}).status_code == 401
    with_token = web.post(f"/status/campaigns/{campaign}/pause", data={"csrf_token": csrf(web), "token": TOKEN})
    assert with_token.status_code == 302
    assert web.post(f"/status/campaigns/{campaign}/resume", data={}).status_code == 400  # no CSRF token
    assert _status(db, campaign) == "PAUSED"


def test_api_controls(web, seed, db, queues):
    campaign = seed.campaign([seed.problem("p")])
    stopped = seed.campaign([seed.problem("q")], status="STOPPED")
    headers = {"Authorization": f"Bearer {TOKEN}"}

    assert web.post(f"/api/campaigns/{campaign}/pause").status_code == 401
    assert web.post(f"/api/campaigns/{campaign}/pause", headers=headers).get_json() == {
        "id": campaign, "status": "PAUSED"}
    assert web.post(f"/api/campaigns/{campaign}/pause", headers=headers).get_json()["status"] == "PAUSED"
    assert web.post(f"/api/campaigns/{campaign}/resume", headers=headers).get_json()["status"] == "RUNNING"
    assert web.post(f"/api/campaigns/{campaign}/resume", headers=headers).status_code == 200
    assert queues.llen("plan") == 1  # only the resume that changed something ticks
    conflict = web.post(f"/api/campaigns/{stopped}/resume", headers=headers)
    assert conflict.status_code == 409 and "STOPPED" in conflict.get_json()["error"]
    assert web.post(f"/api/campaigns/{campaign}/restart", headers=headers).status_code == 404
    assert web.post("/api/campaigns/99/pause", headers=headers).status_code == 404


def _status(db, campaign_id: int) -> str:
    with db.session() as session:
        return session.get(CampaignRow, campaign_id).status



def test_an_evaluators_faults_are_shown_and_it_is_unhealthy_while_they_are_recent(web, queues):
    assert web.get("/api/status").get_json()["evaluator_faults"] == []  # Redis asked, nothing kept
    record_fault(queues, "evaluator@gpu-2", "a-1", EvaluatorFault("saving input set 0 failed: [Errno 28] No space"))
    long_ago = datetime.now(timezone.utc) - UNHEALTHY_AFTER - timedelta(minutes=1)
    record_fault(queues, "evaluator@gpu-3", "a-2", EvaluatorFault("the checker stopped answering"), now=long_ago)

    faults = {f["evaluator"]: f for f in web.get("/api/status").get_json()["evaluator_faults"]}
    assert faults["evaluator@gpu-2"]["unhealthy"] and faults["evaluator@gpu-2"]["last_hour"] == 1
    assert faults["evaluator@gpu-2"]["last_message"].startswith("EvaluatorFault: saving input set 0 failed")
    assert not faults["evaluator@gpu-3"]["unhealthy"] and faults["evaluator@gpu-3"]["last_attempt"] == "a-2"
    html = web.get("/status").get_data(as_text=True)
    assert 'id="evaluator-faults"' in html and "unhealthy" in html and "No space" in html


def test_a_campaigns_reason_is_shown_beside_its_status(web, seed, db):
    idle = seed.campaign([seed.problem("p")], name="local")
    ended = seed.campaign([seed.problem("q")], name="nightly", status="STOPPED")
    with db.session() as session:
        session.get(CampaignRow, idle).status_reason = "idle: every problem retired (1)"
        session.get(CampaignRow, ended).status_reason = "token <budget> spent"

    html = web.get("/status").get_data(as_text=True)
    row = re.search(rf'<tr id="campaign-{idle}">.*?</tr>', html, re.DOTALL).group(0)
    assert "RUNNING" in row and "idle: every problem retired (1)" in row
    assert "token &lt;budget&gt; spent" in html  # escaped
    assert web.get("/api/status").get_json()["campaigns"][1]["status_reason"] == "idle: every problem retired (1)"


def test_llm_endpoint_errors_are_shown_at_once_fatal_ones_as_such(web, queues):
    assert web.get("/api/status").get_json()["endpoint_errors"] == []  # Redis asked, nothing kept
    record_endpoint_error(queues, EndpointUnavailable("rate_limit", "Rate limit reached for gpt-4o"), "gpt-4o", 7)
    record_endpoint_error(queues, EndpointError("auth", "LLM endpoint https://api.example/v1 (model gpt-4o): "
                                                "Incorrect API key provided: sk-ab****"), "gpt-4o", 8)

    newest, older = web.get("/api/status").get_json()["endpoint_errors"]
    assert (newest["kind"], newest["fatal"], newest["assignment"]) == ("auth", True, 8)
    assert (older["kind"], older["fatal"], older["model"]) == ("rate_limit", False, "gpt-4o")
    html = web.get("/status").get_data(as_text=True)
    section = re.search(r'<section id="endpoint-errors">.*?</section>', html, re.DOTALL).group(0)
    assert "fatal: campaign paused" in section and "Incorrect API key provided" in section and "retried" in section
