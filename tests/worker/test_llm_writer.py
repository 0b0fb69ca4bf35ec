"""An assignment written by the LLM agent: attempts recorded with the model and its tokens."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fake_openai import ScriptedEndpoint, tool_call
from services.planner.sweep import expire_leases
from services.worker.write import run_assignment
from shared.db import AssignmentRow, AttemptRow, CampaignRow, utcnow
from shared.errors import RetryableError
from shared.repository import get_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem
from shared.settings import Settings
from sqlalchemy import func, select

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
SOURCE = "import torch\n\ndef run(hidden_states, weight, output):\n    output.copy_(hidden_states)\n"


def add_assignment(runtime: Runtime, guidance: str | None = None) -> int:
    """A running campaign on the RMSNorm problem with one QUEUED assignment of 3 attempts."""
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, load_problem(PROBLEMS / "llama31_8b_rmsnorm")).id
        campaign = CampaignRow(name="c", device="cpu", status="RUNNING")
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
        assert endpoint.requests[1]["messages"][-1]["content"].startswith("status: INCORRECT_NUMERICAL")
    finally:
        endpoint.close()
        runtime.db.dispose()


def test_an_unreachable_endpoint_gives_the_assignment_back_for_the_planner_to_reassign(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runtime = Runtime(Settings(home=tmp_path, problems_dir=PROBLEMS, attempt_wait_s=5.0, model="test-model",
                               openai_api_key="sk-test", openai_base_url=f"http://127.0.0.1:{port}/v1"))
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
