"""One assignment: propose, record, send to the evaluator, wait for the verdict, repeat.

The evaluator is the writer's tool: every call is a recorded attempt. The writer waits for each
verdict (polling the DB, the system of record) because its next proposal depends on it.
"""

from __future__ import annotations

import logging
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from services.worker.tuner import propose
from shared.db import AssignmentRow, AttemptRow, CampaignRow, ProblemRow, utcnow
from shared.repository import IN_FLIGHT, create_attempt, get_solution, put_solution
from shared.runtime import Runtime
from shared.schema import Solution
from shared.schema.problem import load_problem

log = logging.getLogger(__name__)
POLL_S = 0.5

SendEvaluate = Callable[[str, str], None]


def run_assignment(runtime: Runtime, assignment_id: int, send_evaluate: SendEvaluate) -> int:
    """Returns the number of attempts made. Idempotent: a finished assignment does nothing."""
    db = runtime.db
    with db.session() as session:
        assignment = session.get(AssignmentRow, assignment_id)
        if assignment is None or assignment.status == "DONE":
            return 0
        assignment.status, assignment.worker = "RUNNING", platform.node()
        campaign = session.get(CampaignRow, assignment.campaign_id)
        problem = session.get(ProblemRow, assignment.problem_id)
        device, budget = campaign.device, assignment.budget_attempts
        seeds = _seeds(problem)
        problem_id, campaign_id, name = problem.id, campaign.id, problem.name
    rng = random.Random(assignment_id)
    made = 0
    for _ in range(budget):
        if not _campaign_running(runtime, campaign_id):
            break
        attempt_id = _submit_next(runtime, problem_id, campaign_id, assignment_id, device, seeds, rng)
        if attempt_id is None:
            log.info("problem=%s search space exhausted", name)
            break
        send_evaluate(attempt_id, device)
        made += 1
        status = _wait(runtime, attempt_id)
        log.info("problem=%s attempt=%s status=%s", name, attempt_id, status)
    with db.session() as session:
        assignment = session.get(AssignmentRow, assignment_id)
        assignment.status, assignment.finished_at = "DONE", utcnow()
    return made


def _seeds(problem: ProblemRow) -> list[Solution]:
    if not problem.source_path or not Path(problem.source_path).is_dir():
        return []
    return list(load_problem(Path(problem.source_path)).seeds)


def _submit_next(runtime: Runtime, problem_id: int, campaign_id: int, assignment_id: int, device: str,
                 seeds: list[Solution], rng: random.Random) -> str | None:
    with runtime.db.session() as session:
        rows = session.execute(select(AttemptRow.solution_hash, AttemptRow.status, AttemptRow.speedup)
                               .where(AttemptRow.problem_id == problem_id, AttemptRow.device == device)).all()
        tried = {r.solution_hash for r in rows}
        passed = [r for r in rows if r.status == "PASSED" and r.speedup is not None]
        best = None
        if passed:
            top = max(passed, key=lambda r: r.speedup)
            best = (get_solution(runtime.store, top.solution_hash), top.solution_hash)
        proposal = propose(seeds, tried, best, rng)
        if proposal is None:
            return None
        digest = put_solution(session, runtime.store, problem_id, proposal.solution, proposal.parent_hash)
        attempt = create_attempt(session, problem_id, digest, device, campaign_id=campaign_id,
                                 assignment_id=assignment_id, worker=platform.node())
        return attempt.id  # committed when the session closes, before the task is sent


def _campaign_running(runtime: Runtime, campaign_id: int) -> bool:
    with runtime.db.session() as session:
        return session.get(CampaignRow, campaign_id).status == "RUNNING"


def _wait(runtime: Runtime, attempt_id: str) -> str:
    """The attempt's status once finished, or its in-flight status when `attempt_wait_s` runs out."""
    deadline = time.monotonic() + runtime.settings.attempt_wait_s
    while True:
        with runtime.db.session() as session:
            status = session.get(AttemptRow, attempt_id).status
        remaining_s = deadline - time.monotonic()
        if status not in IN_FLIGHT or remaining_s <= 0:
            return status
        time.sleep(min(POLL_S, remaining_s))
