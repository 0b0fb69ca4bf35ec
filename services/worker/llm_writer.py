"""One assignment written by an LLM agent instead of the tuner (when OPENAI_API_KEY is set).

Binds the agent loop (`agent.py`) to the swarm: each `evaluate` tool call becomes a recorded
attempt (author and model: the configured model; tokens: those spent since the previous attempt),
is sent to the evaluate queue, and its verdict is read back from the DB as compact feedback.
`profile` and `inspect` go through `services.worker.diagnose` (recorded attempts too), `note`
through `shared.notes`, each offered only where its module is installed. Tokens that no attempt
carries (a closing `submit`, turns after the last attempt) are added to `assignments.tokens`.

Endpoint errors are recorded where `up` and `/status` read them (`shared.endpoints`). A fatal one
(a wrong key or model, no quota) also pauses the campaign with the error as its reason and ends
the assignment CANCELLED: no write is sent to that endpoint again until the setting is fixed and
the campaign resumed. A passing one (rate limit, 5xx) gives the assignment back to be retried.
"""

from __future__ import annotations

import importlib
import logging
import platform
from collections.abc import Callable
from typing import NamedTuple

import redis
from sqlalchemy import select, update

from services.worker.agent import Budget, Feedback, Model, SessionConfig, Tools, problem_brief, run_session
from services.worker.feedback import feedback_text
from services.worker.llm import ChatModel
from shared.db import AssignmentRow, AttemptRow, BaselineRow, CampaignRow, ProblemRow, TraceRow
from shared.endpoints import record_endpoint_error
from shared.errors import EndpointError, EndpointUnavailable
from shared.repository import VERDICT_KIND, create_attempt, get_solution, problem_from_row, put_solution
from shared.runtime import Runtime
from shared.schema import Solution, Trace

log = logging.getLogger(__name__)

Wait = Callable[[str], str]  # attempt id -> final status
STOPPED = "status: STOPPED (the campaign paused or the assignment ended); submit now"


class Outcome(NamedTuple):
    made: int  # attempts recorded
    status: str  # what the assignment ends as: DONE, or CANCELLED after a fatal endpoint error


def chat_model(runtime: Runtime) -> ChatModel:
    settings = runtime.settings
    return ChatModel(settings.model, settings.openai_base_url, settings.openai_api_key or "",
                     read_timeout_s=settings.agent_read_timeout_s, turn_timeout_s=settings.agent_turn_timeout_s)


def agent_attempts(runtime: Runtime, job, send_evaluate: Callable[[str, str], None], wait: Wait,
                   held: Callable[[], bool], model: Model | None = None) -> Outcome:
    """Run one agent session for the assignment."""
    settings = runtime.settings
    model = model or chat_model(runtime)
    with runtime.db.session() as session:
        problem = problem_from_row(session.get(ProblemRow, job.problem_id))
    brief = problem_brief(problem, known_figures(runtime, job), _best(runtime, job), job.guidance, job.device,
                          _read_notes(runtime, job.problem_id))
    budget = Budget(turns=settings.agent_turns, evaluations=min(settings.agent_evaluations, job.remaining),
                    tokens=settings.agent_tokens, notes=settings.agent_notes)
    made = 0
    latest: dict[str, str | None] = {"attempt": None}  # the session's last evaluation: what a note is backed by

    def stopped() -> bool:
        return not held() or not _running(runtime, job.campaign_id)

    def evaluate(solution: Solution, tokens: int) -> Feedback:
        nonlocal made
        if stopped():
            add_assignment_tokens(runtime, job.assignment_id, tokens)
            return Feedback("STOPPED", STOPPED)
        attempt_id = _record(runtime, job, model.model, solution, tokens)
        send_evaluate(attempt_id, job.device)
        made, latest["attempt"] = made + 1, attempt_id
        status = wait(attempt_id)
        return Feedback(status, _feedback(runtime, attempt_id, status))

    def diagnosis(kind: str, diagnose: Callable) -> Callable:
        def run(solution: Solution, target: str | None, tokens: int) -> str:
            nonlocal made
            if stopped():
                add_assignment_tokens(runtime, job.assignment_id, tokens)
                return STOPPED
            made += 1
            target_args = {"workload_uuid": target} if kind == "profile" else {"kernel": target}
            return diagnose(runtime, job, model.model, solution, kind, **target_args, tokens=tokens,
                            send_evaluate=send_evaluate, wait=wait)
        return run

    tools = _tools(runtime, job, model.model, evaluate, diagnosis, lambda: latest["attempt"])
    config = SessionConfig("cuda" if job.device.startswith("cuda") else "pytorch", settings.agent_context_tokens,
                           settings.agent_reply_tokens, retry_wait_s=settings.agent_retry_wait_s)
    try:
        result = run_session(model, problem, brief, tools, budget, config,
                             record_tokens=lambda tokens: add_assignment_tokens(runtime, job.assignment_id, tokens))
    except EndpointError as error:
        _endpoint_failed(runtime, job, model.model, error)
        return Outcome(made, "CANCELLED")
    except EndpointUnavailable as error:
        _record_endpoint_error(runtime, error, model.model, job.assignment_id)
        raise
    log.info("assignment=%s agent session: %s turns, %s evaluations, %s tokens, ended by %s", job.assignment_id,
             result.turns, result.evaluations, result.tokens, result.stopped_by)
    return Outcome(made, "DONE")


def _tools(runtime: Runtime, job, author: str, evaluate, diagnosis, latest: Callable[[], str | None]) -> Tools:
    """`profile` and `inspect` on a CUDA device where `services.worker.diagnose` is installed;
    `note` where `shared.notes` is, each note linked to the session's latest evaluation (`latest`):
    the planner's trimming keeps notes backed by a measured attempt."""
    diagnose = _optional("services.worker.diagnose", "diagnose") if job.device.startswith("cuda") else None
    append_note = _optional("shared.notes", "append_note")
    return Tools(
        evaluate,
        profile=diagnosis("profile", diagnose) if diagnose else None,
        inspect=diagnosis("inspect", diagnose) if diagnose else None,
        note=(lambda text: append_note(runtime, job.problem_id, author, text, attempt_id=latest()))
        if append_note else None)


def _optional(module: str, name: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise  # the module is there and itself fails to import: a bug to see, not a tool to hide
        return None


def _read_notes(runtime: Runtime, problem_id: int) -> str | None:
    read_notes = _optional("shared.notes", "read_notes")
    return read_notes(runtime, problem_id) if read_notes else None


def _record(runtime: Runtime, job, model_name: str, solution: Solution, tokens: int) -> str:
    with runtime.db.session() as session:
        digest = put_solution(session, runtime.store, job.problem_id, solution, job.parent_hash)
        attempt = create_attempt(session, job.problem_id, digest, job.device, campaign_id=job.campaign_id,
                                 assignment_id=job.assignment_id, worker=platform.node())
        attempt.model, attempt.tokens = model_name, tokens
        return attempt.id


def add_assignment_tokens(runtime: Runtime, assignment_id: int, tokens: int) -> None:
    """Tokens of the assignment's session that no recorded attempt carries."""
    if tokens <= 0:
        return
    with runtime.db.session() as session:
        session.execute(update(AssignmentRow).where(AssignmentRow.id == assignment_id)
                        .values(tokens=AssignmentRow.tokens + tokens).execution_options(synchronize_session=False))


def _endpoint_failed(runtime: Runtime, job, model_name: str, error: EndpointError) -> None:
    """Record the error and pause the campaign with it as the reason (if it still runs)."""
    log.error("assignment=%s LLM endpoint refused the writer (%s): %s; pausing campaign %s", job.assignment_id,
              error.kind, error, job.campaign_id)
    _record_endpoint_error(runtime, error, model_name, job.assignment_id)
    reason = f"LLM endpoint error ({error.kind}): {error}"[:255]
    with runtime.db.session() as session:
        session.execute(update(CampaignRow).where(CampaignRow.id == job.campaign_id, CampaignRow.status == "RUNNING")
                        .values(status="PAUSED", status_reason=reason).execution_options(synchronize_session=False))


def _record_endpoint_error(runtime: Runtime, error: Exception, model_name: str, assignment_id: int) -> None:
    url = runtime.settings.redis_url
    if not url:
        log.warning("no Redis configured: the LLM endpoint error is only in this log: %s", error)
        return
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        record_endpoint_error(client, error, model_name, assignment_id)
    finally:
        client.close()


def known_figures(runtime: Runtime, job) -> dict[str, dict[str, float]]:
    """Per workload uuid, what is known without running anything: the reference's latency and
    T_sol from the problem's latest traces on this device, T_b from its stored baselines."""
    figures: dict[str, dict[str, float]] = {}
    with runtime.db.session() as session:
        rows = session.execute(
            select(TraceRow.workload_uuid, TraceRow.reference_latency_ms, TraceRow.t_baseline_ms, TraceRow.t_sol_ms)
            .join(AttemptRow, AttemptRow.id == TraceRow.attempt_id)
            .where(AttemptRow.problem_id == job.problem_id, AttemptRow.device == job.device)
            .order_by(TraceRow.id)).all()
        baselines = session.execute(select(BaselineRow.workload_uuid, BaselineRow.eager_ms, BaselineRow.compile_ms)
                                    .where(BaselineRow.problem_id == job.problem_id)
                                    .order_by(BaselineRow.measured_at)).all()
    for workload_uuid, reference_ms, baseline_ms, t_sol_ms in rows:  # the latest of each wins
        known = figures.setdefault(workload_uuid, {})
        for name, value in (("reference", reference_ms), ("T_b", baseline_ms), ("T_sol", t_sol_ms)):
            if value is not None:
                known[name] = value
    for workload_uuid, eager_ms, compile_ms in baselines:
        measured = [v for v in (eager_ms, compile_ms) if v is not None]
        if measured and "T_b" not in figures.get(workload_uuid, {}):
            figures.setdefault(workload_uuid, {})["T_b"] = min(measured)
    return {uuid: {k: known[k] for k in ("reference", "T_b", "T_sol") if k in known}
            for uuid, known in figures.items()}


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
                                         AttemptRow.device == job.device, AttemptRow.kind == VERDICT_KIND)
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
