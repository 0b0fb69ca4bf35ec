"""An assignment written by the LLM agent: attempts recorded with the model and its tokens."""

from __future__ import annotations

import re
import socket
import sys
import types
from pathlib import Path

import pytest
import redis
from fake_openai import RATE_LIMITED, ScriptedEndpoint, tool_call
from kernelswarm.launcher import RedisServer
from services.planner.sweep import expire_leases
from services.worker.write import run_assignment
from shared.db import AssignmentRow, AttemptRow, BaselineRow, CampaignRow, utcnow
from shared.db.models import NoteRow
from shared.endpoints import endpoint_errors
from shared.errors import EndpointUnavailable, RetryableError
from shared.repository import get_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem
from shared.settings import Settings
from sqlalchemy import func, select

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
SOURCE = "import torch\n\ndef run(hidden_states, weight, output):\n    output.copy_(hidden_states)\n"


def add_assignment(runtime: Runtime, guidance: str | None = None, device: str = "cpu") -> int:
    """A running campaign on the RMSNorm problem with one QUEUED assignment of 3 attempts."""
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, load_problem(PROBLEMS / "llama31_8b_rmsnorm")).id
        campaign = CampaignRow(name="c", device=device, status="RUNNING")
        session.add(campaign)
        session.flush()
        assignment = AssignmentRow(campaign_id=campaign.id, problem_id=problem_id, budget_attempts=3,
                                   status="QUEUED", guidance=guidance)
        session.add(assignment)
        session.flush()
        return assignment.id


def test_agent_writes_when_an_api_key_is_set(tmp_path):
    endpoint = ScriptedEndpoint([
        tool_call("evaluate", {"language": "pytorch", "files": [{"path": "main.py", "content": SOURCE}]}),
        tool_call("submit", {}, "call_2"),
    ])
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-test", openai_base_url=endpoint.url))
    try:
        assignment_id = add_assignment(runtime, guidance="the last attempt was slow")
        with runtime.db.session() as session:  # a baseline the evaluator measured earlier: known without running
            assignment = session.get(AssignmentRow, assignment_id)
            first = load_problem(PROBLEMS / "llama31_8b_rmsnorm").workloads[0].uuid
            session.add(BaselineRow(problem_id=assignment.problem_id, workload_uuid=first, hardware="LOCAL",
                                    eager_ms=0.25, compile_ms=0.125))

        def judge(attempt_id: str, device: str) -> None:  # the evaluator's verdict, at once
            with runtime.db.session() as session:
                attempt = session.get(AttemptRow, attempt_id)
                attempt.status, attempt.message, attempt.finished_at = "INCORRECT_NUMERICAL", "wrong", utcnow()

        made = run_assignment(runtime, assignment_id, judge)
        with runtime.db.session() as session:
            rows = session.scalars(select(AttemptRow).where(AttemptRow.assignment_id == assignment_id)).all()
            status = session.get(AssignmentRow, assignment_id).status
            assignment_tokens = session.get(AssignmentRow, assignment_id).tokens
        assert made == 1 and status == "DONE"
        assert rows[0].model == "test-model" and rows[0].tokens == endpoint.usages[0]
        assert assignment_tokens == endpoint.usages[1]  # the closing submit's turn, which made no attempt
        assert get_solution(runtime.store, rows[0].solution_hash).author == "test-model"
        brief = endpoint.requests[0]["messages"][1]["content"]
        assert "the last attempt was slow" in brief  # the planner's guidance reaches the model
        assert re.search(r"^1\. \{.*\}: T_b 0\.125 ms$", brief, re.MULTILINE)  # the workload's baseline
        assert endpoint.requests[1]["messages"][-1]["content"].startswith("status: INCORRECT_NUMERICAL")
    finally:
        endpoint.close()
        runtime.db.dispose()


def test_an_unreachable_endpoint_gives_the_assignment_back_for_the_planner_to_reassign(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-test", openai_base_url=f"http://127.0.0.1:{port}/v1",
                               agent_retry_wait_s=0.0))
    try:
        assignment_id = add_assignment(runtime)

        def never(attempt_id: str, device: str) -> None:
            raise AssertionError("nothing reaches the evaluator without a model")

        with pytest.raises(RetryableError, match="LLM endpoint"):  # the task retries it, backing off
            run_assignment(runtime, assignment_id, never)
        with runtime.db.session() as session:
            row = session.get(AssignmentRow, assignment_id)
            assert row.status == "RUNNING" and row.lease_until <= utcnow()  # given back at once
            assert session.scalar(select(func.count()).select_from(AttemptRow)) == 0
        assert expire_leases(runtime.db, utcnow(), 3600.0) == [assignment_id]  # the planner's sweep takes it
    finally:
        runtime.db.dispose()


@pytest.fixture
def redis_url(tmp_path):
    server = RedisServer(tmp_path / "redis")
    yield server.url
    server.stop()


def test_a_wrong_key_cancels_the_assignment_pauses_the_campaign_and_is_recorded(tmp_path, redis_url):
    endpoint = ScriptedEndpoint([tool_call("submit", {})], api_keys={"sk-right"})
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-wrong", openai_base_url=endpoint.url, redis_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    try:
        assignment_id = add_assignment(runtime)

        def never(attempt_id: str, device: str) -> None:
            raise AssertionError("nothing reaches the evaluator without a model")

        assert run_assignment(runtime, assignment_id, never) == 0
        with runtime.db.session() as session:
            assignment = session.get(AssignmentRow, assignment_id)
            campaign = session.get(CampaignRow, assignment.campaign_id)
            assert assignment.status == "CANCELLED" and campaign.status == "PAUSED"
            assert campaign.status_reason.startswith("LLM endpoint error (auth)") and "OPENAI_API_KEY" in \
                campaign.status_reason
        assert expire_leases(runtime.db, utcnow(), 3600.0) == []  # nothing for the planner to hand out again
        assert len(endpoint.requests) == 1  # the key is not tried again
        (recorded,) = endpoint_errors(client)
        assert recorded["fatal"] and recorded["kind"] == "auth" and recorded["assignment"] == assignment_id
    finally:
        client.close()
        endpoint.close()
        runtime.db.dispose()


def test_a_rate_limit_is_recorded_and_the_assignment_given_back(tmp_path, redis_url):
    endpoint = ScriptedEndpoint([RATE_LIMITED] * 9)  # 3 tries of the turn, each with the client's 2 retries
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-test", openai_base_url=endpoint.url, redis_url=redis_url,
                               agent_retry_wait_s=0.0))
    client = redis.Redis.from_url(redis_url)
    try:
        assignment_id = add_assignment(runtime)
        with pytest.raises(EndpointUnavailable, match="Rate limit reached"):
            run_assignment(runtime, assignment_id, lambda attempt_id, device: None)
        with runtime.db.session() as session:
            assert session.get(AssignmentRow, assignment_id).status == "RUNNING"
            assert session.get(CampaignRow, session.get(AssignmentRow, assignment_id).campaign_id).status == "RUNNING"
        (recorded,) = endpoint_errors(client)
        assert not recorded["fatal"] and recorded["kind"] == "rate_limit" and len(endpoint.requests) == 9
    finally:
        client.close()
        endpoint.close()
        runtime.db.dispose()


def test_profile_and_note_are_bound_to_the_diagnose_and_notes_modules(tmp_path, monkeypatch):
    """`services.worker.diagnose` faked (another module's job): what the writer passes it; the
    note goes through the real `shared.notes` and reaches the next writer's brief."""
    calls = []

    def diagnose(runtime, job, model_name, solution, kind, *, workload_uuid=None, kernel=None, tokens=0,
                 send_evaluate=None, wait=None):
        calls.append((job.assignment_id, model_name, solution.author, kind, workload_uuid, kernel, tokens))
        return "profile: 1 kernel, 40% of DRAM bandwidth"

    monkeypatch.setitem(sys.modules, "services.worker.diagnose", types.SimpleNamespace(diagnose=diagnose))
    solution = {"language": "pytorch", "files": [{"path": "main.py", "content": SOURCE}]}
    endpoint = ScriptedEndpoint([
        tool_call("profile", {**solution, "workload": 1}, "call_1"),
        tool_call("note", {"text": "copying the input is 40% of bandwidth"}, "call_2"),
        tool_call("submit", {}, "call_3"),
        tool_call("submit", {}, "call_1"),  # the second writer's
    ])
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-test", openai_base_url=endpoint.url))
    try:
        assignment_id = add_assignment(runtime, device="cuda")
        run_assignment(runtime, assignment_id, lambda attempt_id, device: None)
        offered = [t["function"]["name"] for t in endpoint.requests[0]["tools"]]
        assert offered == ["evaluate", "profile", "inspect", "note", "submit"]
        first = load_problem(PROBLEMS / "llama31_8b_rmsnorm").workloads[0].uuid
        assert calls == [(assignment_id, "test-model", "test-model", "profile", first, None, endpoint.usages[0])]
        assert endpoint.requests[1]["messages"][-1]["content"].startswith("profile: 1 kernel")
        assert endpoint.requests[2]["messages"][-1]["content"].startswith("noted")
        run_assignment(runtime, add_assignment(runtime, device="cuda"), lambda attempt_id, device: None)
        assert "copying the input is 40% of bandwidth" in endpoint.requests[3]["messages"][1]["content"]
    finally:
        endpoint.close()
        runtime.db.dispose()


def test_a_note_is_linked_to_the_sessions_latest_evaluation(tmp_path):
    """The planner's trimming keeps notes backed by a measured attempt: the note says which."""
    solution = {"language": "pytorch", "files": [{"path": "main.py", "content": SOURCE}]}
    endpoint = ScriptedEndpoint([
        tool_call("note", {"text": "nothing measured yet"}, "call_1"),
        tool_call("evaluate", solution, "call_2"),
        tool_call("note", {"text": "the seed's copy of the input costs a third"}, "call_3"),
        tool_call("submit", {}, "call_4"),
    ])
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=0.5, model="test-model",
                               openai_api_key="sk-test", openai_base_url=endpoint.url))
    try:
        run_assignment(runtime, add_assignment(runtime), lambda attempt_id, device: None)
        with runtime.db.session() as session:
            (attempt_id,) = session.scalars(select(AttemptRow.id)).all()
            notes = session.execute(select(NoteRow.text, NoteRow.attempt_id).order_by(NoteRow.id)).all()
        assert [tuple(n) for n in notes] == [("nothing measured yet", None),
                                             ("the seed's copy of the input costs a third", attempt_id)]
    finally:
        endpoint.close()
        runtime.db.dispose()
