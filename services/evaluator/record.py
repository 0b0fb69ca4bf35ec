"""Evaluate a recorded attempt and write its outcome: traces in the DB and, as JSONL, in the store."""

from __future__ import annotations

import dataclasses
import logging
import platform

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from shared.db import AttemptRow, BaselineRow, Database, ProblemRow, TraceRow, utcnow
from shared.errors import NotFoundError
from shared.repository import IN_FLIGHT, get_solution, problem_from_row
from shared.runtime import Runtime
from shared.schema import AttemptInfo

from services.evaluator.evaluate import EvalConfig, environment, evaluate, scratch_root
from services.evaluator.spares import spares_for

log = logging.getLogger(__name__)


def evaluate_attempt(runtime: Runtime, attempt_id: str, device: str) -> str:
    """Run the attempt once; a finished attempt is left as it is (tasks may be redelivered)."""
    db, store = runtime.db, runtime.store
    with db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        if attempt is None:
            raise NotFoundError(f"no attempt {attempt_id}")
        if attempt.status not in IN_FLIGHT:
            return attempt.status
        attempt.status = "RUNNING"
        attempt.worker = attempt.worker or platform.node()
        problem = problem_from_row(session.get(ProblemRow, attempt.problem_id))
        problem_id = attempt.problem_id
        info = AttemptInfo(campaign=str(attempt.campaign_id) if attempt.campaign_id else None,
                           worker=attempt.worker, parent=None)
        solution_hash = attempt.solution_hash
    solution = get_solution(store, solution_hash)
    log.info("evaluating attempt=%s problem=%s solution=%s", attempt_id, problem.name, solution_hash[:12])
    hardware = environment(device).hardware
    cached = _compile_baselines(db, problem_id, hardware)
    config = EvalConfig.from_settings(runtime.settings, device, store)
    config = dataclasses.replace(config, spares=spares_for(device, scratch_root(config)), compile_baselines=cached,
                                 measure_compile=device.startswith("cuda") and len(cached) < len(problem.workloads))
    result = evaluate(problem, solution, config, attempt=info)
    traces_hash = store.put(result.traces_jsonl())
    with db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status = result.status.value
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
    _store_compile_baselines(db, problem_id, hardware, result.compile_ms, cached)
    log.info("attempt=%s status=%s speedup=%s", attempt_id, result.status.value, result.speedup)
    return result.status.value


def _compile_baselines(db: Database, problem_id: int, hardware: str) -> dict[str, float | None]:
    """torch.compile times already measured for this problem on this hardware, by workload uuid
    (None where the reference did not compile: it is not tried again)."""
    with db.session() as session:
        rows = session.scalars(select(BaselineRow).where(BaselineRow.problem_id == problem_id,
                                                         BaselineRow.hardware == hardware)).all()
        return {r.workload_uuid: r.compile_ms for r in rows}


def _store_compile_baselines(db: Database, problem_id: int, hardware: str, measured: dict[str, float | None],
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
