"""Evaluate a recorded attempt and write its outcome: traces in the DB and, as JSONL, in the store."""

from __future__ import annotations

import logging
import platform

from shared.db import AttemptRow, ProblemRow, TraceRow, utcnow
from shared.errors import NotFoundError
from shared.repository import IN_FLIGHT, get_solution, problem_from_row
from shared.runtime import Runtime
from shared.schema import AttemptInfo

from services.evaluator.evaluate import EvalConfig, environment, evaluate

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
        info = AttemptInfo(campaign=str(attempt.campaign_id) if attempt.campaign_id else None,
                           worker=attempt.worker, parent=None)
        solution_hash = attempt.solution_hash
    solution = get_solution(store, solution_hash)
    log.info("evaluating attempt=%s problem=%s solution=%s", attempt_id, problem.name, solution_hash[:12])
    result = evaluate(problem, solution, EvalConfig.from_settings(runtime.settings, device, store),
                      attempt=info)
    traces_hash = store.put(result.traces_jsonl())
    with db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status = result.status.value
        attempt.hardware = environment(device).hardware
        attempt.workloads_total = len(result.traces)
        attempt.workloads_passed = result.workloads_passed
        attempt.latency_ms = result.latency_ms
        attempt.speedup = result.speedup
        attempt.message = result.message[:4000] or None
        attempt.traces_hash = traces_hash
        attempt.finished_at = utcnow()
        for trace in result.traces:
            perf = trace.evaluation.performance
            session.add(TraceRow(attempt_id=attempt_id, workload_uuid=trace.workload.uuid,
                                 status=trace.evaluation.status.value,
                                 latency_ms=perf.latency_ms if perf else None,
                                 reference_latency_ms=perf.reference_latency_ms if perf else None,
                                 speedup=perf.speedup_factor if perf else None,
                                 trace_json=trace.model_dump_json(exclude_none=True)))
    log.info("attempt=%s status=%s speedup=%s", attempt_id, result.status.value, result.speedup)
    return result.status.value
