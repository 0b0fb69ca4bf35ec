"""One assignment written by an LLM agent instead of the tuner (when OPENAI_API_KEY is set).

Binds the agent loop (`agent.py`) to the swarm: each `evaluate` tool call becomes a recorded
attempt (author and model: the configured model; tokens: those spent since the previous attempt),
is sent to the evaluate queue, and its verdict is read back from the DB as compact feedback.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable

from sqlalchemy import select

from services.worker.agent import Budget, Feedback, Model, problem_brief, run_session
from services.worker.feedback import feedback_text
from services.worker.llm import ChatModel
from shared.db import AttemptRow, CampaignRow, ProblemRow, TraceRow
from shared.repository import create_attempt, get_solution, problem_from_row, put_solution
from shared.runtime import Runtime
from shared.schema import Solution, Trace

log = logging.getLogger(__name__)

Wait = Callable[[str], str]  # attempt id -> final status


def chat_model(runtime: Runtime) -> ChatModel:
    settings = runtime.settings
    return ChatModel(settings.model, settings.openai_base_url, settings.openai_api_key or "")


def agent_attempts(runtime: Runtime, job, send_evaluate: Callable[[str, str], None], wait: Wait,
                   held: Callable[[], bool], model: Model | None = None) -> int:
    """Run one agent session for the assignment; returns the number of attempts it made."""
    settings = runtime.settings
    model = model or chat_model(runtime)
    with runtime.db.session() as session:
        problem = problem_from_row(session.get(ProblemRow, job.problem_id))
    best = _best(runtime, job)
    brief = problem_brief(problem, best=best, guidance=job.guidance, device=job.device)
    budget = Budget(turns=settings.agent_turns, evaluations=min(settings.agent_evaluations, job.remaining),
                    tokens=settings.agent_tokens)
    made = 0

    def evaluate(solution: Solution, tokens: int) -> Feedback:
        nonlocal made
        if not held() or not _running(runtime, job.campaign_id):
            return Feedback("STOPPED", "status: STOPPED (the campaign paused or the assignment ended); submit now")
        with runtime.db.session() as session:
            digest = put_solution(session, runtime.store, job.problem_id, solution, job.parent_hash)
            attempt = create_attempt(session, job.problem_id, digest, job.device, campaign_id=job.campaign_id,
                                     assignment_id=job.assignment_id, worker=platform.node())
            attempt.model, attempt.tokens = model.model, tokens
            attempt_id = attempt.id
        send_evaluate(attempt_id, job.device)
        made += 1
        status = wait(attempt_id)
        return Feedback(status, _feedback(runtime, attempt_id, status))

    language = "cuda" if job.device.startswith("cuda") else "pytorch"
    result = run_session(model, problem, brief, evaluate, budget, default_language=language)
    log.info("assignment=%s agent session: %s turns, %s evaluations, %s tokens, ended by %s", job.assignment_id,
             result.turns, result.evaluations, result.tokens, result.stopped_by)
    return made


def _feedback(runtime: Runtime, attempt_id: str, status: str) -> str:
    with runtime.db.session() as session:
        rows = session.scalars(select(TraceRow.trace_json).where(TraceRow.attempt_id == attempt_id)
                               .order_by(TraceRow.id)).all()
        message = session.get(AttemptRow, attempt_id).message
    return feedback_text(status, message, [Trace.model_validate_json(r) for r in rows])


def _best(runtime: Runtime, job) -> tuple[Solution, str] | None:
    """The assignment's parent, else the best PASSED attempt on the problem, with its feedback."""
    with runtime.db.session() as session:
        query = select(AttemptRow).where(AttemptRow.problem_id == job.problem_id, AttemptRow.status == "PASSED",
                                         AttemptRow.device == job.device)
        if job.parent_hash:
            query = query.where(AttemptRow.solution_hash == job.parent_hash)
        rows = session.scalars(query).all()
        if not rows:
            return None
        top = max(rows, key=lambda r: (r.sol_score if r.sol_score is not None else -1.0, r.speedup or 0.0))
        top_id, top_hash = top.id, top.solution_hash
    return get_solution(runtime.store, top_hash), _feedback(runtime, top_id, "PASSED")


def _running(runtime: Runtime, campaign_id: int) -> bool:
    with runtime.db.session() as session:
        return session.get(CampaignRow, campaign_id).status == "RUNNING"
