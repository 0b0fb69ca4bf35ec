"""Evaluate a recorded attempt and write its outcome: traces in the DB and, as JSONL, in the store."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError, InterfaceError, InternalError, OperationalError
from sqlalchemy.orm import Session

from shared.db import AttemptRow, BaselineRow, Database, ProblemRow, TraceRow, utcnow
from shared.errors import DatabaseFault, EvaluatorFault, NotFoundError, RetryableError
from shared.repository import (
    IN_FLIGHT, NOT_EVALUATED, PARTIAL, PROFILE, VERDICT_KIND, attempt_workloads, get_solution, problem_from_row,
)
from shared.runtime import Runtime
from shared.schema import AttemptInfo, Status

from services.evaluator.calibrate import stored
from services.evaluator.config import EvalConfig
from services.evaluator.evaluate import build_arch, environment, evaluate, scratch_root
from services.evaluator.machine import MachineLimits, machine_fault
from services.evaluator.score import hardware_for
from services.evaluator.spares import spares_for
from services.evaluator.tools.attempt import answer

log = logging.getLogger(__name__)


MAX_TRIES = 2  # evaluations an attempt may start: one whose evaluator died under it twice is quarantined
DIED_MESSAGE = ("quarantined: its evaluator died {tries} times while running it (a crash, an out-of-memory kill "
                "or a restart); not run again")
DB_FAULTS = (OperationalError, InterfaceError, InternalError)  # the DB's own failures, not a wrong query
WRITE_TRIES = 4  # a verdict in hand is written again this often (backoff 1, 2, 4 s) before the task retries
WRITE_BACKOFF_S = 1.0
HEARTBEAT_S = 30.0  # how often an evaluator says, in `attempts.seen_at`, that it still runs its attempt
T = TypeVar("T")


def evaluate_attempt(runtime: Runtime, attempt_id: str, device: str, evaluator: str | None = None,
                     stale_after_s: float | None = None) -> str:
    """Run the attempt once; a finished attempt is left as it is (tasks may be redelivered).

    `evaluator` names this evaluator (its Celery node): it holds the attempt while RUNNING. Another
    evaluator takes a RUNNING attempt over only once it is `stale_after_s` old (its holder is gone:
    the broker redelivers only after that). The verdict is written only while this evaluator still
    holds the attempt, or after the planner gave it up for lost (a verdict that arrives wins)."""
    db = runtime.db
    me = evaluator or f"{platform.node()}/{os.getpid()}"
    with db_faults("claiming the attempt"), db.session() as session:
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
        with db_faults("evaluating the attempt"), heartbeat(db, attempt_id, me):
            if kind != VERDICT_KIND:
                return _diagnose_claimed(runtime, attempt_id, device, me, problem, problem_id, solution_hash, kind,
                                         tool_args)
            return _evaluate_claimed(runtime, attempt_id, device, me, problem, problem_id, info, solution_hash,
                                     partial)
    except RetryableError:  # the store or the DB failed, not the solution: give the claim back
        _release(db, attempt_id, me)
        raise


@contextmanager
def db_faults(what: str) -> Iterator[None]:
    """The DB's own failures (a disk I/O error, a lost connection) as `DatabaseFault`: the task
    retries them with backoff; a bug in a query stays what it is."""
    try:
        yield
    except DB_FAULTS as error:
        raise DatabaseFault(f"the DB failed while {what}: {getattr(error, 'orig', None) or error}") from error


def write_retrying(db: Database, what: str, write: Callable[[Session], T]) -> T:
    """`write` in a transaction of its own, tried again with backoff while the DB fails: what an
    evaluation measured is not thrown away for a DB that fails for a second. `write` re-reads the
    row (a commit that did land, and a retry that finds it done, write nothing twice)."""
    for attempt in range(WRITE_TRIES):
        try:
            with db.session() as session:
                return write(session)
        except DB_FAULTS as error:
            if attempt == WRITE_TRIES - 1:
                raise DatabaseFault(f"the DB failed while {what} ({WRITE_TRIES} tries): "
                                    f"{getattr(error, 'orig', None) or error}") from error
            log.warning("the DB failed while %s (try %d of %d): %s", what, attempt + 1, WRITE_TRIES, error)
            time.sleep(WRITE_BACKOFF_S * 2 ** attempt)
    raise AssertionError("unreachable")


@contextmanager
def heartbeat(db: Database, attempt_id: str, me: str) -> Iterator[None]:
    """While the attempt runs, `seen_at` every HEARTBEAT_S: the planner's sweep sends again a
    RUNNING attempt whose evaluator stopped beating (it died, froze, or its task ended without a
    verdict) and never one that still runs, however long it takes."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                with db.session() as session:
                    session.execute(update(AttemptRow).where(AttemptRow.id == attempt_id,
                                                             AttemptRow.status == "RUNNING", AttemptRow.evaluator == me)
                                    .values(seen_at=utcnow()).execution_options(synchronize_session=False))
            except DB_FAULTS as error:  # the next beat tries again; the sweep waits several of them
                log.warning("attempt=%s heartbeat not written: %s", attempt_id, error)

    thread = threading.Thread(target=beat, name=f"heartbeat-{attempt_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


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
    fault = machine_fault(result, MachineLimits.measure(scratch_root(config)))
    if fault is not None:  # the machine's limit, not the candidate's: retried, never its verdict
        raise EvaluatorFault(fault)
    traces_hash = store.put(result.traces_jsonl())
    status = write_retrying(db, f"writing attempt={attempt_id}'s verdict",
                            functools.partial(_record_verdict, attempt_id=attempt_id, me=me, result=result,
                                              partial=partial, hardware=hardware, traces_hash=traces_hash))
    store_compile_baselines(db, problem_id, hardware, result.compile_ms, cached)
    log.info("attempt=%s status=%s speedup=%s", attempt_id, status, result.speedup)
    return status


def _record_verdict(session: Session, attempt_id: str, me: str, result, partial: bool, hardware: str,
                    traces_hash: str) -> str:
    """The attempt's verdict and traces, while this evaluator still holds it (else nothing)."""
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
    return attempt.status


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

    def write(session: Session) -> str:
        attempt = session.get(AttemptRow, attempt_id)
        if not _still_ours(session, attempt, me):
            log.warning("attempt=%s was taken over while this evaluator ran it: %s dropped", attempt_id, done.status)
            return attempt.status
        attempt.status, attempt.message, attempt.hardware = done.status, done.message or None, hardware
        attempt.workloads_total = len(problem.workloads) if kind == PROFILE else 0
        attempt.gpu_seconds = round(done.seconds, 3) if device.startswith("cuda") else 0.0
        attempt.finished_at = utcnow()
        return attempt.status

    status = write_retrying(runtime.db, f"writing {kind} attempt={attempt_id}'s answer", write)
    log.info("attempt=%s %s status=%s", attempt_id, kind, status)
    return status


def _claim(session: Session, attempt_id: str, me: str, stale_after_s: float | None) -> bool:
    """PENDING -> RUNNING under `me`, in one conditional UPDATE (two evaluators given the same
    attempt: one wins). Also RUNNING ones that are `me`'s (this evaluator died and came back) or
    stale (no heartbeat for that long). Counts the try."""
    now = utcnow()
    takeable = [AttemptRow.status == "PENDING", AttemptRow.evaluator == me, AttemptRow.evaluator.is_(None)]
    if stale_after_s is not None:
        seen = func.coalesce(AttemptRow.seen_at, AttemptRow.started_at)
        takeable.append(seen < now - timedelta(seconds=stale_after_s))
    return session.execute(
        update(AttemptRow).where(AttemptRow.id == attempt_id, AttemptRow.status.in_(IN_FLIGHT), or_(*takeable))
        .values(status="RUNNING", evaluator=me, started_at=now, seen_at=now, tries=AttemptRow.tries + 1)
        .execution_options(synchronize_session=False)).rowcount == 1


def _still_ours(session: Session, attempt: AttemptRow, me: str) -> bool:
    """Whether this evaluator may write the verdict: it still holds the attempt, or the planner
    gave it up for lost meanwhile; never when another evaluator holds it or a verdict was written."""
    if attempt.status == "RUNNING":
        return attempt.evaluator == me
    has_traces = session.scalar(select(TraceRow.id).where(TraceRow.attempt_id == attempt.id).limit(1)) is not None
    return attempt.status == "TIMEOUT" and not has_traces


def _release(db: Database, attempt_id: str, me: str) -> None:
    """Back to PENDING, the try not counted: it never ran. Where the DB refuses even that, the
    attempt stays RUNNING without a heartbeat: the planner's sweep sends it again."""
    try:
        with db.session() as session:
            session.execute(update(AttemptRow).where(AttemptRow.id == attempt_id, AttemptRow.status == "RUNNING",
                                                     AttemptRow.evaluator == me)
                            .values(status="PENDING", evaluator=None, tries=AttemptRow.tries - 1)
                            .execution_options(synchronize_session=False))
    except DB_FAULTS as error:
        log.warning("attempt=%s claim not given back (the sweep will send it again): %s", attempt_id, error)


def give_up(runtime: Runtime, attempt_id: str, error: Exception, tries: int) -> None:
    """After the task's last retry of an infrastructure fault (the store, the DB, `EvaluatorFault`):
    NOT_EVALUATED, which says so and is no verdict (the planner counts it for neither the problem
    nor the writer), rather than an attempt left PENDING until the planner's deadline. A DB that
    refuses even that leaves it to the planner's sweep, which sends it again."""
    try:
        with runtime.db.session() as session:
            attempt = session.get(AttemptRow, attempt_id)
            if attempt is not None and attempt.status == "PENDING":
                attempt.status, attempt.finished_at = NOT_EVALUATED, utcnow()
                attempt.message = f"not evaluated: {error} (gave up after {tries} tries)"
    except DB_FAULTS as failure:
        log.error("attempt=%s could not be given up (the sweep will send it again): %s", attempt_id, failure)
        return
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
        except DB_FAULTS as error:  # measured again by a later attempt
            log.warning("baseline for %s on %s not stored: %s", uuid, hardware, error)
