"""One assignment: propose, record, send to the evaluator, wait for the verdict, repeat.

The evaluator is the writer's tool: every call is a recorded attempt. The writer waits for each
verdict (polling the DB, the system of record) because its next proposal depends on it.

The assignment protocol (the planner's side is `services/planner/`):
- Claim: a QUEUED assignment, or a RUNNING one whose lease ran out (its writer died), becomes this
  writer's in one conditional UPDATE; a duplicate `write` message therefore finds nothing to do.
- Budget: the attempts already recorded for the assignment (by a writer that died) count, so a
  redelivered task never exceeds `budget_attempts`.
- Lease: renewed by a heartbeat thread while the writer works (every `lease_s / 3`); if the planner
  closed the assignment meanwhile (lease expired), the writer stops and leaves it as it is.
- Brief: `parent_hash` is where the search starts (the tuner halves its seed's tunables first and
  walks its neighbours until this assignment beats it), `language` picks the seeds in that language
  when there are any, `guidance` is for LLM agents (the tuner logs it).
- Halving: the tuner's state is the problem's attempts and traces, read again before every
  proposal; an attempt of a halving rung records the workloads it runs. When a rung waits for
  attempts still in flight (another writer's, or the last of a writer that died), the writer waits
  for them, without spending its budget, and stops if they do not finish in `attempt_wait_s`.
- End: DONE, or CANCELLED when the campaign stopped or paused before any attempt was made. A DONE
  assignment without attempts tells the planner the writer had nothing left to try.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from services.evaluator.languages import runs_on
from services.worker.llm_writer import agent_attempts
from services.worker.halving import Measured
from services.worker.tuner import (
    Screening, Wait, base_of, current_values, dispatch_solution, propose, shape_key, written_out,
)
from shared.db import AssignmentRow, AttemptRow, CampaignRow, ProblemRow, TraceRow, utcnow
from shared.repository import (
    IN_FLIGHT, PARTIAL, PASSED, VERDICT_KIND, create_attempt, get_solution, problem_from_row, put_solution,
)
from shared.runtime import Runtime
from shared.schema import Solution
from shared.schema.problem import load_problem

log = logging.getLogger(__name__)
POLL_S = 0.5
LEASE_S = 60.0
SUBMIT_TRIES = 3
CLOSED = ("DONE", "CANCELLED")

SendEvaluate = Callable[[str, str], None]


@dataclass(frozen=True)
class Job:
    """A claimed assignment."""

    assignment_id: int
    campaign_id: int
    problem_id: int
    problem_name: str
    device: str
    remaining: int  # the budget less the attempts already recorded for the assignment
    made_before: int
    language: str | None
    parent_hash: str | None
    guidance: str | None  # for LLM agents; the tuner only logs it
    seeds: tuple[Solution, ...]
    workloads: tuple[str, ...] = ()  # the problem's workload uuids, in order (the tuner's halving)


def held_by(assignment_id: int, holder: str) -> tuple:
    """The assignment, while this writer holds it."""
    return AssignmentRow.id == assignment_id, AssignmentRow.status == "RUNNING", AssignmentRow.worker == holder


class Lease:
    """The writer's hold on a RUNNING assignment, renewed every third of its length by a heartbeat
    thread for as long as the writer works on it (however long an LLM turn takes); `held` turns
    False once a renewal finds the assignment no longer this writer's (the planner expired it)."""

    def __init__(self, runtime: Runtime, assignment_id: int, holder: str, lease_s: float) -> None:
        self.runtime, self.assignment_id, self.holder, self.lease_s = runtime, assignment_id, holder, lease_s
        self._stop, self._lost = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{assignment_id}", daemon=True)

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def held(self) -> bool:
        return not self._lost.is_set()

    def _beat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                if not self._renew():
                    self._lost.set()
                    return
            except SQLAlchemyError:  # the DB is down: try again next beat (the lease may run out)
                log.exception("assignment=%s lease renewal failed", self.assignment_id)

    def _renew(self) -> bool:
        with self.runtime.db.session() as session:
            return session.execute(
                update(AssignmentRow).where(*held_by(self.assignment_id, self.holder))
                .values(lease_until=utcnow() + timedelta(seconds=self.lease_s))
                .execution_options(synchronize_session=False)).rowcount == 1


def run_assignment(runtime: Runtime, assignment_id: int, send_evaluate: SendEvaluate, lease_s: float = LEASE_S) -> int:
    """Returns the number of attempts this call made. Idempotent: an assignment that is finished,
    unknown or held by a live writer is left alone."""
    holder = f"{platform.node()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    job = _claim(runtime, assignment_id, holder, lease_s)
    if job is None:
        return 0
    log.info("assignment=%s problem=%s language=%s parent=%s guidance=%r", assignment_id, job.problem_name,
             job.language, (job.parent_hash or "")[:12], job.guidance)
    try:
        return _run(runtime, job, holder, send_evaluate, lease_s)
    except Exception:
        _release(runtime, assignment_id, holder)  # the planner's next sweep reassigns the slot
        raise


def _run(runtime: Runtime, job: Job, holder: str, send_evaluate: SendEvaluate, lease_s: float) -> int:
    with Lease(runtime, job.assignment_id, holder, lease_s) as lease:
        return _attempts(runtime, job, holder, send_evaluate, lease)


def _attempts(runtime: Runtime, job: Job, holder: str, send_evaluate: SendEvaluate, lease: Lease) -> int:
    assignment_id = job.assignment_id
    if runtime.settings.openai_api_key:  # an LLM writes; without a key, the tuner
        outcome = agent_attempts(runtime, job, send_evaluate, lambda a: _wait(runtime, a, lease), lambda: lease.held)
        _finish(runtime, assignment_id, holder, outcome.status)  # CANCELLED: the endpoint refused it for good
        return outcome.made
    rng = random.Random(assignment_id)
    made, stopped = 0, False
    while made < job.remaining:
        if not lease.held:
            log.warning("assignment=%s lease lost: stopping", assignment_id)
            return made
        if not _campaign_running(runtime, job.campaign_id):
            stopped = True
            break
        attempt_id = _submit_next(runtime, job, rng)
        if isinstance(attempt_id, Wait):
            if _wait_for_others(runtime, job, attempt_id, lease):
                continue
            break
        if attempt_id is None:
            log.info("problem=%s search space exhausted", job.problem_name)
            break
        send_evaluate(attempt_id, job.device)
        made += 1
        status = _wait(runtime, attempt_id, lease)
        log.info("problem=%s attempt=%s status=%s", job.problem_name, attempt_id, status)
    cancelled = stopped and job.made_before + made == 0
    _finish(runtime, assignment_id, holder, "CANCELLED" if cancelled else "DONE")
    return made


def assignment_closed(runtime: Runtime, assignment_id: int) -> bool:
    """DONE or CANCELLED: the planner should hear of it (again, if it already did)."""
    with runtime.db.session() as session:
        assignment = session.get(AssignmentRow, assignment_id)
        return assignment is not None and assignment.status in CLOSED


def _claim(runtime: Runtime, assignment_id: int, holder: str, lease_s: float) -> Job | None:
    now = utcnow()
    with runtime.db.session() as session:
        claimable = or_(AssignmentRow.status == "QUEUED", and_(
            AssignmentRow.status == "RUNNING",
            or_(AssignmentRow.lease_until.is_(None), AssignmentRow.lease_until < now)))
        claimed = session.execute(
            update(AssignmentRow).where(AssignmentRow.id == assignment_id, claimable)
            .values(status="RUNNING", worker=holder, writer=runtime.settings.writer,
                    lease_until=now + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False)).rowcount
        if claimed != 1:
            return None
        assignment = session.get(AssignmentRow, assignment_id)
        campaign = session.get(CampaignRow, assignment.campaign_id)
        problem = session.get(ProblemRow, assignment.problem_id)
        made_before = session.scalar(select(func.count()).select_from(AttemptRow)
                                     .where(AttemptRow.assignment_id == assignment_id))
        if made_before:
            log.info("assignment=%s taken over with %s of %s attempts made", assignment_id, made_before,
                     assignment.budget_attempts)
        return Job(assignment_id, campaign.id, problem.id, problem.name, campaign.device,
                   max(0, assignment.budget_attempts - made_before), made_before, assignment.language,
                   assignment.parent_hash, assignment.guidance,
                   tuple(_seeds(problem, assignment.language, campaign.device)),
                   tuple(w.uuid for w in problem_from_row(problem).workloads))


def _release(runtime: Runtime, assignment_id: int, holder: str) -> None:
    """Give the lease up now: a retried task may claim the assignment again at once; otherwise the
    planner's next sweep expires it."""
    with runtime.db.session() as session:
        session.execute(update(AssignmentRow).where(*held_by(assignment_id, holder))
                        .values(lease_until=utcnow()).execution_options(synchronize_session=False))


def _finish(runtime: Runtime, assignment_id: int, holder: str, status: str) -> None:
    with runtime.db.session() as session:
        session.execute(update(AssignmentRow).where(*held_by(assignment_id, holder))
                        .values(status=status, finished_at=utcnow(), lease_until=None)
                        .execution_options(synchronize_session=False))


def _seeds(problem: ProblemRow, language: str | None, device: str) -> list[Solution]:
    """The problem's seeds that the campaign's device runs, only those in `language` when there
    are any."""
    if not problem.source_path or not Path(problem.source_path).is_dir():
        return []
    seeds = [s for s in load_problem(Path(problem.source_path)).seeds if runs_on(s, device)]
    in_language = [s for s in seeds if language in {item.value for item in s.spec.languages}]
    return in_language or seeds


def _submit_next(runtime: Runtime, job: Job, rng: random.Random) -> str | Wait | None:
    """Record the tuner's next proposal as a PENDING attempt. Two writers on one problem may propose
    the same solution at once: the one that loses the insert proposes again, knowing the other's."""
    for _ in range(SUBMIT_TRIES - 1):
        try:
            return _submit_once(runtime, job, rng)
        except IntegrityError:
            log.info("problem=%s solution recorded concurrently by another writer: proposing again", job.problem_name)
    return _submit_once(runtime, job, rng)


def _submit_once(runtime: Runtime, job: Job, rng: random.Random) -> str | Wait | None:
    with runtime.db.session() as session:
        rows = session.execute(select(AttemptRow.id, AttemptRow.solution_hash, AttemptRow.status,
                                      AttemptRow.speedup, AttemptRow.sol_score, AttemptRow.assignment_id,
                                      AttemptRow.workload_uuids)
                               .where(AttemptRow.problem_id == job.problem_id, AttemptRow.device == job.device,
                                      AttemptRow.kind == VERDICT_KIND)  # a writer's profile or inspect is no try
                               .order_by(AttemptRow.created_at, AttemptRow.id)).all()
        tried = {r.solution_hash for r in rows}
        best = _best(runtime, rows, job)
        eta = runtime.settings.tuner_eta
        screening = _screening(session, job, rows, eta) if eta >= 2 else None
        proposal = propose(list(job.seeds), tried, best, rng, lambda: _dispatch(runtime, session, job, best),
                           screening)
        if proposal is None or isinstance(proposal, Wait):
            return proposal
        digest = put_solution(session, runtime.store, job.problem_id, proposal.solution, proposal.parent_hash)
        attempt = create_attempt(session, job.problem_id, digest, job.device, campaign_id=job.campaign_id,
                                 assignment_id=job.assignment_id, worker=platform.node(),
                                 workload_uuids=proposal.workloads)
        log.info("problem=%s proposed %s (%s)", job.problem_name, proposal.solution.name, proposal.reason)
        return attempt.id  # committed when the session closes, before the task is sent


def _screening(session, job: Job, rows, eta: int) -> Screening:
    """The halving's state: every attempt on the problem (this device) with what it ran and, from
    its PASSED traces, its latency per workload."""
    latencies: dict[str, dict[str, float]] = {}
    for attempt_id, workload_uuid, latency_ms in session.execute(
            select(TraceRow.attempt_id, TraceRow.workload_uuid, TraceRow.latency_ms)
            .join(AttemptRow, AttemptRow.id == TraceRow.attempt_id)
            .where(AttemptRow.problem_id == job.problem_id, AttemptRow.device == job.device,
                   AttemptRow.kind == VERDICT_KIND, AttemptRow.status.in_((PASSED, PARTIAL)), TraceRow.status == PASSED,
                   TraceRow.latency_ms.is_not(None))):
        latencies.setdefault(attempt_id, {})[workload_uuid] = latency_ms
    everything = frozenset(job.workloads)
    measured = tuple(Measured(r.id, r.solution_hash,
                              frozenset(json.loads(r.workload_uuids)) if r.workload_uuids else everything,
                              r.status not in IN_FLIGHT, r.status in (PASSED, PARTIAL), latencies.get(r.id, {}))
                     for r in rows)
    return Screening(job.workloads, measured, eta)


def _wait_for_others(runtime: Runtime, job: Job, wait: Wait, lease: Lease) -> bool:
    """Wait for the first attempt the halving waits on; False when it is still in flight after
    `attempt_wait_s` (or the lease was lost): the writer stops rather than spin."""
    log.info("problem=%s waiting for %d attempts in flight before the next rung", job.problem_name,
             len(wait.attempt_ids))
    status = _wait(runtime, wait.attempt_ids[0], lease)
    if status in IN_FLIGHT:
        log.warning("problem=%s attempt=%s still %s: stopping", job.problem_name, wait.attempt_ids[0], status)
        return False
    return True


def _dispatch(runtime: Runtime, session, job: Job, best: tuple[Solution, str] | None) -> Solution | None:
    """The solution that sends each workload's shapes to the variant of the best's seed that was
    fastest on that workload (its PASSED traces on the problem, of attempts that ran every workload:
    a halving rung's partial figures do not count), when two or more variants win."""
    if best is None:
        return None
    seed = base_of(best[0], written_out(job.seeds))
    if seed is None or not seed.spec.tunables:
        return None
    fastest: dict[str, tuple[float, str]] = {}
    for workload_uuid, latency_ms, solution_hash in session.execute(
            select(TraceRow.workload_uuid, TraceRow.latency_ms, AttemptRow.solution_hash)
            .join(AttemptRow, AttemptRow.id == TraceRow.attempt_id)
            .where(AttemptRow.problem_id == job.problem_id, AttemptRow.device == job.device,
                   AttemptRow.workload_uuids.is_(None), TraceRow.status == PASSED,
                   TraceRow.latency_ms.is_not(None))):
        if workload_uuid not in fastest or latency_ms < fastest[workload_uuid][0]:
            if solution_hash == best[1] or base_of(_solution(runtime, solution_hash), [seed]) is not None:
                fastest[workload_uuid] = (latency_ms, solution_hash)
    problem = problem_from_row(session.get(ProblemRow, job.problem_id))
    dps = seed.spec.destination_passing_style
    winners = {}
    for workload in problem.workloads:
        if workload.uuid in fastest:
            variant = best[0] if fastest[workload.uuid][1] == best[1] else _solution(runtime, fastest[workload.uuid][1])
            winners[shape_key(problem.definition, workload, dps)] = current_values(variant)
    return dispatch_solution(seed, winners, current_values(best[0]))


_SOLUTIONS: dict[str, Solution] = {}


def _solution(runtime: Runtime, solution_hash: str) -> Solution:
    """A solution never changes under its hash (the SHA-256 of its content): read once per process."""
    if solution_hash not in _SOLUTIONS:
        if len(_SOLUTIONS) > 4096:
            _SOLUTIONS.clear()
        _SOLUTIONS[solution_hash] = get_solution(runtime.store, solution_hash)
    return _SOLUTIONS[solution_hash]


def _best(runtime: Runtime, rows, job: Job) -> tuple[Solution, str] | None:
    """Where the search goes on from: the best PASSED solution on the problem; with a parent, the
    parent until this assignment beats it."""
    passed = [r for r in rows if r.status == PASSED and r.speedup is not None]  # never PARTIAL
    if job.parent_hash:
        passed = [r for r in passed if r.assignment_id == job.assignment_id or r.solution_hash == job.parent_hash]
        if not passed:
            return get_solution(runtime.store, job.parent_hash), job.parent_hash
    if not passed:
        return None
    top = max(passed, key=lambda r: (r.sol_score if r.sol_score is not None else -1.0, r.speedup))
    return get_solution(runtime.store, top.solution_hash), top.solution_hash


def _campaign_running(runtime: Runtime, campaign_id: int) -> bool:
    with runtime.db.session() as session:
        return session.get(CampaignRow, campaign_id).status == "RUNNING"


def _wait(runtime: Runtime, attempt_id: str, lease: Lease) -> str:
    """The attempt's status once finished, or its in-flight status when `attempt_wait_s` runs out
    or the lease is lost."""
    deadline = time.monotonic() + runtime.settings.attempt_wait_s
    while True:
        with runtime.db.session() as session:
            status = session.get(AttemptRow, attempt_id).status
        remaining_s = deadline - time.monotonic()
        if status not in IN_FLIGHT or remaining_s <= 0 or not lease.held:
            return status
        time.sleep(min(POLL_S, remaining_s))
