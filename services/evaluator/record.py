"""Evaluate a recorded attempt and write its outcome: traces in the DB and, as JSONL, in the store."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shared.db import AttemptRow, BaselineRow, Database, ProblemRow, TraceRow, utcnow
from shared.errors import NotFoundError, RetryableError
from shared.repository import (
    IN_FLIGHT, NOT_EVALUATED, PARTIAL, PROFILE, VERDICT_KIND, attempt_workloads, get_solution, problem_from_row,
)
from shared.runtime import Runtime
from shared.schema import AttemptInfo, Status

from services.evaluator.calibrate import stored
from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import build_arch, environment, evaluate, scratch_root
from services.evaluator.score import hardware_for
from services.evaluator.spares import spares_for
from services.evaluator.tools.attempt import answer

log = logging.getLogger(__name__)


MAX_TRIES = 2  # evaluations an attempt may start: one whose evaluator died under it twice is not run again
DIED_MESSAGE = ("its evaluator died {tries} times while running it (a crash, an out-of-memory kill or a "
                "restart); not run again")


def evaluate_attempt(runtime: Runtime, attempt_id: str, device: str, evaluator: str | None = None,
                     stale_after_s: float | None = None) -> str:
    """Run the attempt once; a finished attempt is left as it is (tasks may be redelivered).

    `evaluator` names this evaluator (its Celery node): it holds the attempt while RUNNING. Another
    evaluator takes a RUNNING attempt over only once it is `stale_after_s` old (its holder is gone:
    the broker redelivers only after that). The verdict is written only while this evaluator still
    holds the attempt, or after the planner gave it up for lost (a verdict that arrives wins)."""
    db = runtime.db
    me = evaluator or f"{platform.node()}/{os.getpid()}"
    with db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if attempt is None:
            raise NotFoundError(f"no attempt {attempt_id}")
        if attempt.status not in IN_FLIGHT:
            return attempt.status
        if not _claim(session, attempt_id, me, stale_after_s):
            log.info("attempt=%s is held by evaluator %s: left to it", attempt_id, attempt.evaluator)
            return attempt.status
        session.refresh(attempt)
        if attempt.tries > MAX_TRIES:
            _finish_unrunnable(attempt, DIED_MESSAGE.format(tries=attempt.tries - 1))
            log.warning("attempt=%s: %s", attempt_id, attempt.message)
            return attempt.status
        attempt.worker = attempt.worker or platform.node()
        whole = problem_from_row(session.get(ProblemRow, attempt.problem_id))
        problem = attempt_workloads(whole, attempt.workload_uuids)
        partial = len(problem.workloads) < len(whole.workloads)
        problem_id = attempt.problem_id
        info = AttemptInfo(campaign=str(attempt.campaign_id) if attempt.campaign_id else None,
                           worker=attempt.worker, parent=None)
        solution_hash, kind, tool_args = attempt.solution_hash, attempt.kind or VERDICT_KIND, attempt.tool_args
    try:
        if kind != VERDICT_KIND:
            return _diagnose_claimed(runtime, attempt_id, device, me, problem, problem_id, solution_hash, kind,
                                     tool_args)
        return _evaluate_claimed(runtime, attempt_id, device, me, problem, problem_id, info, solution_hash, partial)
    except RetryableError:  # the store or the DB failed, not the solution: give the claim back
        _release(db, attempt_id, me)
        raise


def _evaluate_claimed(runtime: Runtime, attempt_id: str, device: str, me: str, problem, problem_id: int,
                      info: AttemptInfo, solution_hash: str, partial: bool) -> str:
    """`problem` holds the workloads the attempt runs; `partial`: not all of the problem's, so a
    pass is PARTIAL, not PASSED."""
    db, store = runtime.db, runtime.store
    solution = get_solution(store, solution_hash)
    log.info("evaluating attempt=%s problem=%s solution=%s", attempt_id, problem.name, solution_hash[:12])
    hardware = environment(device).hardware
    cached = compile_baselines(db, problem_id, hardware)
    config = dataclasses.replace(_config(runtime, device, hardware), compile_baselines=cached,
                                 measure_compile=device.startswith("cuda") and len(cached) < len(problem.workloads))
    result = evaluate(problem, solution, config, attempt=info)
    traces_hash = store.put(result.traces_jsonl())
    with db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if not _still_ours(session, attempt, me):
            log.warning("attempt=%s was taken over (%s, %s) while this evaluator ran it: verdict %s dropped",
                        attempt_id, attempt.status, attempt.evaluator, result.status.value)
            return attempt.status
        attempt.status = PARTIAL if partial and result.status is Status.PASSED else result.status.value
        attempt.hardware = hardware
        attempt.sol_score = result.sol_score
        attempt.workloads_total = len(result.traces)
        attempt.workloads_passed = result.workloads_passed
        attempt.latency_ms = result.latency_ms
        attempt.speedup = result.speedup
        attempt.message = result.message[:4000] or None
        attempt.traces_hash = traces_hash
        attempt.finished_at = utcnow()
        for trace in result.traces:
            perf, sol = trace.evaluation.performance, trace.evaluation.sol
            session.add(TraceRow(attempt_id=attempt_id, workload_uuid=trace.workload.uuid,
                                 status=trace.evaluation.status.value,
                                 latency_ms=perf.latency_ms if perf else None,
                                 reference_latency_ms=perf.reference_latency_ms if perf else None,
                                 speedup=perf.speedup_factor if perf else None,
                                 t_sol_ms=sol.t_sol_ms if sol else None,
                                 t_baseline_ms=sol.t_baseline_ms if sol else None,
                                 sol_score=sol.score if sol else None,
                                 trace_json=trace.model_dump_json(exclude_none=True)))
        status = attempt.status
    store_compile_baselines(db, problem_id, hardware, result.compile_ms, cached)
    log.info("attempt=%s status=%s speedup=%s", attempt_id, status, result.speedup)
    return status


def _config(runtime: Runtime, device: str, hardware: str) -> EvalConfig:
    """The evaluator's knobs for an attempt on `device`: settings, spares, calibrated ceilings."""
    config = EvalConfig.from_settings(runtime.settings, device, runtime.store)
    calibration, spec = stored(runtime.db, hardware), hardware_for(hardware)
    if calibration is not None:
        priced = calibration.apply_to(spec) if spec else calibration.as_spec()  # a CPU: its measurements alone
    else:
        priced = config.hardware
    return dataclasses.replace(config, spares=spares_for(device, scratch_root(config), config.fork_server),
                               hardware=priced)


def _diagnose_claimed(runtime: Runtime, attempt_id: str, device: str, me: str, problem, problem_id: int,
                      solution_hash: str, kind: str, tool_args: str | None) -> str:
    """A diagnostic attempt (`tools.attempt`): its text in the message, its status never a verdict,
    the time it held this evaluator as its GPU seconds (none on a CPU evaluator). No trace."""
    solution = get_solution(runtime.store, solution_hash)
    log.info("%s attempt=%s problem=%s solution=%s", kind, attempt_id, problem.name, solution_hash[:12])
    hardware = environment(device).hardware
    config = _config(runtime, device, hardware)
    done = answer(kind, tool_args, problem, solution, config, build_arch(config), config.hardware, hardware)
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if not _still_ours(session, attempt, me):
            log.warning("attempt=%s was taken over while this evaluator ran it: %s dropped", attempt_id, done.status)
            return attempt.status
        attempt.status, attempt.message, attempt.hardware = done.status, done.message or None, hardware
        attempt.workloads_total = len(problem.workloads) if kind == PROFILE else 0
        attempt.gpu_seconds = round(done.seconds, 3) if device.startswith("cuda") else 0.0
        attempt.finished_at = utcnow()
    log.info("attempt=%s %s status=%s", attempt_id, kind, done.status)
    return done.status


def _claim(session: Session, attempt_id: str, me: str, stale_after_s: float | None) -> bool:
    """PENDING -> RUNNING under `me`, in one conditional UPDATE (two evaluators given the same
    attempt: one wins). Also RUNNING ones that are `me`'s (this evaluator died and came back) or
    stale. Counts the try."""
    now = utcnow()
    takeable = [AttemptRow.status == "PENDING", AttemptRow.evaluator == me, AttemptRow.evaluator.is_(None)]
    if stale_after_s is not None:
        takeable.append(AttemptRow.started_at < now - timedelta(seconds=stale_after_s))
    return session.execute(
        update(AttemptRow).where(AttemptRow.id == attempt_id, AttemptRow.status.in_(IN_FLIGHT), or_(*takeable))
        .values(status="RUNNING", evaluator=me, started_at=now, tries=AttemptRow.tries + 1)
        .execution_options(synchronize_session=False)).rowcount == 1


def _still_ours(session: Session, attempt: AttemptRow, me: str) -> bool:
    """Whether this evaluator may write the verdict: it still holds the attempt, or the planner
    gave it up for lost meanwhile; never when another evaluator holds it or a verdict was written."""
    if attempt.status == "RUNNING":
        return attempt.evaluator == me
    has_traces = session.scalar(select(TraceRow.id).where(TraceRow.attempt_id == attempt.id).limit(1)) is not None
    return attempt.status == "TIMEOUT" and not has_traces


def _release(db: Database, attempt_id: str, me: str) -> None:
    """Back to PENDING, the try not counted: it never ran."""
    with db.session() as session:
        session.execute(update(AttemptRow).where(AttemptRow.id == attempt_id, AttemptRow.status == "RUNNING",
                                                 AttemptRow.evaluator == me)
                        .values(status="PENDING", evaluator=None, tries=AttemptRow.tries - 1)
                        .execution_options(synchronize_session=False))


def give_up(runtime: Runtime, attempt_id: str, error: Exception, tries: int) -> None:
    """After the task's last retry of an infrastructure fault (the store, the DB, `EvaluatorFault`):
    NOT_EVALUATED, which says so and is no verdict (the planner counts it for neither the problem
    nor the writer), rather than an attempt left PENDING until the planner's deadline."""
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if attempt is not None and attempt.status == "PENDING":
            attempt.status, attempt.finished_at = NOT_EVALUATED, utcnow()
            attempt.message = f"not evaluated: {error} (gave up after {tries} tries)"
    log.error("attempt=%s not evaluated after %d tries: %s", attempt_id, tries, error)


def _finish_unrunnable(attempt: AttemptRow, message: str) -> None:
    attempt.status, attempt.message, attempt.finished_at = "RUNTIME_ERROR", message, utcnow()


def recover(runtime: Runtime, evaluator: str, send: Callable[[str, str], None]) -> list[str]:
    """At start-up: the attempts this evaluator held when it last died (RUNNING under its name) go
    back to PENDING and are sent again, to whichever evaluator of their queue is free. The tries
    already made count (`MAX_TRIES`); the broker's own redelivery, later, finds them finished."""
    with runtime.db.session() as session:
        rows = session.execute(select(AttemptRow.id, AttemptRow.device).where(
            AttemptRow.status == "RUNNING", AttemptRow.evaluator == evaluator)).all()
        if rows:
            session.execute(update(AttemptRow).where(AttemptRow.id.in_([r.id for r in rows]),
                                                     AttemptRow.status == "RUNNING", AttemptRow.evaluator == evaluator)
                            .values(status="PENDING", evaluator=None).execution_options(synchronize_session=False))
    for attempt_id, device in rows:
        log.warning("attempt=%s was running when evaluator %s stopped: sent again", attempt_id, evaluator)
        send(attempt_id, device)
    return [r.id for r in rows]


def compile_baselines(db: Database, problem_id: int, hardware: str) -> dict[str, float | None]:
    """torch.compile times already measured for this problem on this hardware, by workload uuid
    (None where the reference did not compile: it is not tried again)."""
    with db.session() as session:
        rows = session.scalars(select(BaselineRow).where(BaselineRow.problem_id == problem_id,
                                                         BaselineRow.hardware == hardware)).all()
        return {r.workload_uuid: r.compile_ms for r in rows}


def store_compile_baselines(db: Database, problem_id: int, hardware: str, measured: dict[str, float | None],
                             cached: dict[str, float | None]) -> None:
    """Once per (problem, workload, hardware); another evaluator may have stored it meanwhile."""
    for uuid, compile_ms in measured.items():
        if uuid in cached:
            continue
        try:
            with db.session() as session:
                session.add(BaselineRow(problem_id=problem_id, workload_uuid=uuid, hardware=hardware,
                                        compile_ms=compile_ms))
        except IntegrityError:
            log.info("baseline for %s on %s already stored", uuid, hardware)
