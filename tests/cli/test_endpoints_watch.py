"""What `kernelswarm up` says of the LLM endpoint, and its exit code (kernelswarm/endpoints_watch.py)."""

from __future__ import annotations

import io

import pytest
import redis
from rich.console import Console

from kernelswarm import up
from kernelswarm.endpoints_watch import ENDPOINT_FAILED, EndpointWatch
from kernelswarm.launcher import RedisServer
from services.planner.campaign import create_campaign
from shared.db import AssignmentRow, Database, ProblemRow
from shared.endpoints import record_endpoint_error
from shared.errors import EndpointError, EndpointUnavailable
from shared.settings import Settings


@pytest.fixture
def swarm(tmp_path):
    server = RedisServer(tmp_path / "redis")
    db = Database(f"sqlite:///{tmp_path}/t.db")
    with db.session() as session:
        problem = ProblemRow(name="p", definition_json="{}", workloads_jsonl="")
        session.add(problem)
        session.flush()
        problem_id = problem.id
    campaign_id = create_campaign(db, "local", [problem_id], "cpu", 1, 2)
    client = redis.Redis.from_url(server.url)
    settings = Settings(home=tmp_path, redis_url=server.url, openai_api_key="sk-test")
    yield settings, db, campaign_id, problem_id, client
    client.close()
    db.dispose()
    server.stop()


def console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=400), text


def test_a_fatal_error_is_printed_at_once_stops_the_watch_and_fails_up(swarm):
    settings, db, campaign_id, _problem_id, client = swarm
    watch, (out, text) = EndpointWatch(settings), console()
    assert not watch.poll(1.0, out)
    record_endpoint_error(client, EndpointUnavailable("rate_limit", "Rate limit reached"), "m", 1)
    assert not watch.poll(2.0, out) and "LLM endpoint error (rate_limit): Rate limit reached" in text.getvalue()
    record_endpoint_error(client, EndpointError("model", "The model `gpt-nope` does not exist"), "gpt-nope", 2)
    assert watch.poll(3.0, out)
    assert text.getvalue().count("rate_limit") == 1  # each error said once
    assert "LLM endpoint error (model): The model `gpt-nope` does not exist" in text.getvalue()
    assert watch.exit_code(db, campaign_id, out) == ENDPOINT_FAILED
    assert "KERNELSWARM_MODEL" in text.getvalue()


def test_up_fails_when_writes_were_tried_and_none_reached_the_endpoint(swarm):
    settings, db, campaign_id, problem_id, client = swarm
    watch, (out, text) = EndpointWatch(settings), console()
    record_endpoint_error(client, EndpointUnavailable("unreachable", "Connection refused"), "m", 1)
    assert not watch.poll(1.0, out)
    assert watch.exit_code(db, campaign_id, out) == ENDPOINT_FAILED and "no write reached" in text.getvalue()

    reached = EndpointWatch(settings)
    record_endpoint_error(client, EndpointUnavailable("rate_limit", "Rate limit reached"), "m", 1)
    reached.poll(1.0, out)
    with db.session() as session:  # a session that was answered, then only submitted
        session.add(AssignmentRow(campaign_id=campaign_id, problem_id=problem_id, budget_attempts=2, tokens=900))
    assert reached.exit_code(db, campaign_id, out) == 0


def test_without_an_llm_nothing_is_asked(swarm):
    settings, db, campaign_id, _problem_id, client = swarm
    record_endpoint_error(client, EndpointError("auth", "Incorrect API key"), "m", 1)
    tuner = EndpointWatch(settings.model_copy(update={"openai_api_key": None}))
    out, _text = console()
    assert not tuner.poll(1.0, out) and tuner.exit_code(db, campaign_id, out) == 0


def test_ups_watch_ends_at_the_first_look_after_a_fatal_error(swarm):
    settings, db, campaign_id, _problem_id, client = swarm
    watch = EndpointWatch(settings)  # as `up` makes it, before any writer starts
    record_endpoint_error(client, EndpointError("auth", "Incorrect API key provided: sk-ab****"), "m", 1)

    class Quiet:
        """Services with nothing to report, counting how often `up` looked."""

        looks = 0

        def supervise(self) -> list:
            Quiet.looks += 1
            return []

    out, text = console()
    up._watch(db, campaign_id, Quiet(), 30.0, {"signal": False}, out, watch)
    assert Quiet.looks == 1 and "LLM endpoint error (auth): Incorrect API key provided" in text.getvalue()
    assert watch.exit_code(db, campaign_id, out) == ENDPOINT_FAILED
