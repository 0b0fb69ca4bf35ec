"""What the problem page shows, read from the DB: the problem, its attempts (history and table), the
best attempt and its per-workload results. The object store is read by the blueprint, not here.

Where the best attempt's solution passed in other verdict attempts too, on the same device and
hardware (its repeats), the best attempt's per-workload latencies are spread over all of them
(`shared.spread.combine`): the median of the attempts' medians and the union of their intervals, and
`attempts` says how many. One attempt's own page (`attempt_detail`) shows that attempt alone."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shared.db.models import AttemptRow, ProblemRow, SolutionRow, TraceRow
from shared.errors import NotFoundError
from shared.leaderboard import IN_FLIGHT, PASSED, as_utc, best_order
from shared.repository import VERDICT_KIND, problem_by_name
from shared.schema import Trace
from shared.spread import Spread, combine, spreads

HISTORY_LIMIT = 2000  # the most recent attempts drawn in the chart
TABLE_LIMIT = 100  # the most recent attempts listed in the table
REPEATS_LIMIT = 20  # the most recent repeats of the best attempt whose timings its figures combine

Pairs = dict[str, list[tuple[Spread, Spread]]]  # per workload uuid: (the solution's, the reference's) spreads


class AttemptSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: str
    created_at: datetime
    finished_at: datetime | None
    campaign_id: int | None
    device: str
    hardware: str | None
    worker: str | None
    latency_ms: float | None
    speedup: float | None
    sol_score: float | None
    solution_hash: str
    parent_hash: str | None
    language: str
    author: str
    model: str | None
    tokens: int
    gpu_seconds: float | None
    message: str | None
    traces_hash: str | None


class HistoryPoint(BaseModel):
    """One finished attempt in time order; `value` is its figure (None unless PASSED) and
    `best_so_far` the best figure of the PASSED attempts up to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt_id: str
    at: datetime
    status: str
    value: float | None
    best_so_far: float | None


class History(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str  # "sol_score" once the SOL model scores attempts, "speedup" until then
    total_attempts: int  # finished attempts; `points` holds the latest HISTORY_LIMIT of them
    points: list[HistoryPoint]


class WorkloadResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    workload_uuid: str
    axes: dict[str, int]
    status: str
    latency_ms: float | None
    reference_latency_ms: float | None
    speedup: float | None
    t_sol_ms: float | None
    t_baseline_ms: float | None
    sol_score: float | None
    # The interquartile intervals over the timed runs (shared.spread), where the trace has them, and
    # whether the speedup is clear of the noise: False where the intervals overlap (shown as ≈1x).
    latency_q1_ms: float | None = None
    latency_q3_ms: float | None = None
    reference_q1_ms: float | None = None
    reference_q3_ms: float | None = None
    speedup_clear: bool | None = None
    # How many attempts the figures span: over 1, the latencies are the median of the attempts' medians,
    # the intervals their union and the speedup the ratio of the two medians (shared.spread.combine);
    # T_SOL, T_b and the SOL score stay the best attempt's own, as it was ranked.
    attempts: int = 1


class ProblemDetail(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    op_type: str | None
    description: str | None
    definition: dict[str, Any]
    workloads: list[dict[str, Any]]
    best: AttemptSummary | None
    history: History
    attempts: list[AttemptSummary]  # latest first, at most TABLE_LIMIT
    per_workload: list[WorkloadResult]  # the best attempt's


def problem_detail(session: Session, name: str) -> ProblemDetail:
    row = problem_by_name(session, name)
    definition = json.loads(row.definition_json or "{}")
    workloads = [json.loads(line) for line in row.workloads_jsonl.splitlines() if line.strip()]
    best = _best(session, row.id)
    per_workload = [] if best is None else _per_workload(
        session, best.id, workloads, _repeats(session, row.id, best, len(workloads)))
    return ProblemDetail(
        name=row.name, op_type=row.op_type, description=row.description, definition=definition,
        workloads=workloads, best=best, history=_history(session, row.id),
        attempts=_summaries(session, _attempts_query(row.id).where(AttemptRow.kind == VERDICT_KIND).order_by(
            AttemptRow.created_at.desc(), AttemptRow.id.desc()).limit(TABLE_LIMIT)),  # diagnostics: no verdict
        per_workload=per_workload,
    )


def attempt_detail(session: Session, attempt_id: str) -> tuple[AttemptSummary, str, list[WorkloadResult]]:
    """One attempt, its problem's name and its per-workload results."""
    found = session.execute(_attempts_query(None).add_columns(ProblemRow.name, ProblemRow.workloads_jsonl)
                            .join(ProblemRow, ProblemRow.id == AttemptRow.problem_id)
                            .where(AttemptRow.id == attempt_id)).first()
    if found is None:
        raise NotFoundError(f"no attempt {attempt_id!r}")
    workloads = [json.loads(line) for line in found.workloads_jsonl.splitlines() if line.strip()]
    return _summary(found), found.name, _per_workload(session, attempt_id, workloads)


def _attempts_query(problem_id: int | None):
    query = select(
        AttemptRow.id, AttemptRow.status, AttemptRow.created_at, AttemptRow.finished_at, AttemptRow.campaign_id,
        AttemptRow.device, AttemptRow.hardware, AttemptRow.worker, AttemptRow.latency_ms, AttemptRow.speedup,
        AttemptRow.sol_score, AttemptRow.solution_hash, SolutionRow.parent_hash, SolutionRow.language,
        SolutionRow.author, AttemptRow.model, AttemptRow.tokens, AttemptRow.gpu_seconds, AttemptRow.message,
        AttemptRow.traces_hash,
    ).join(SolutionRow, SolutionRow.hash == AttemptRow.solution_hash)
    return query if problem_id is None else query.where(AttemptRow.problem_id == problem_id)


def _summary(row) -> AttemptSummary:
    return AttemptSummary(
        id=row.id, status=row.status, created_at=as_utc(row.created_at), finished_at=as_utc(row.finished_at),
        campaign_id=row.campaign_id, device=row.device, hardware=row.hardware, worker=row.worker,
        latency_ms=row.latency_ms, speedup=row.speedup, sol_score=row.sol_score, solution_hash=row.solution_hash,
        parent_hash=row.parent_hash, language=row.language, author=row.author, model=row.model,
        tokens=row.tokens or 0, gpu_seconds=row.gpu_seconds, message=row.message, traces_hash=row.traces_hash,
    )


def _summaries(session: Session, query) -> list[AttemptSummary]:
    return [_summary(row) for row in session.execute(query)]


def _best(session: Session, problem_id: int) -> AttemptSummary | None:
    rows = _summaries(session, _attempts_query(problem_id)
                      .where(AttemptRow.status == PASSED, AttemptRow.kind == VERDICT_KIND)
                      .order_by(*best_order()).limit(1))
    return rows[0] if rows else None


def _history(session: Session, problem_id: int) -> History:
    finished_at = func.coalesce(AttemptRow.finished_at, AttemptRow.created_at)
    rows = session.execute(
        select(AttemptRow.id, AttemptRow.status, finished_at.label("at"), AttemptRow.speedup, AttemptRow.sol_score)
        .where(AttemptRow.problem_id == problem_id, AttemptRow.status.not_in(IN_FLIGHT),
               AttemptRow.kind == VERDICT_KIND)
        .order_by(finished_at.desc(), AttemptRow.id.desc()).limit(HISTORY_LIMIT)
    ).all()
    rows.reverse()
    total = session.scalar(select(func.count()).select_from(AttemptRow).where(
        AttemptRow.problem_id == problem_id, AttemptRow.status.not_in(IN_FLIGHT), AttemptRow.kind == VERDICT_KIND))
    metric = "sol_score" if any(r.sol_score is not None for r in rows if r.status == PASSED) else "speedup"
    points, best = [], None
    for row in rows:
        value = getattr(row, metric) if row.status == PASSED else None
        if value is not None and (best is None or value > best):
            best = value
        points.append(HistoryPoint(attempt_id=row.id, at=as_utc(row.at), status=row.status, value=value,
                                   best_so_far=best))
    return History(metric=metric, total_attempts=total or 0, points=points)


def _per_workload(session: Session, attempt_id: str, workloads: list[dict[str, Any]],
                  repeats: Pairs | None = None) -> list[WorkloadResult]:
    """The attempt's traces rows in the order of the workloads; `repeats`, the spreads of other
    attempts of its solution, combined into each workload's figures where the attempt's own trace has
    its intervals (a row without them stands alone)."""
    axes = {w.get("uuid"): w.get("axes", {}) for w in workloads}
    order = {uuid: i for i, uuid in enumerate(axes)}
    rows = session.scalars(select(TraceRow).where(TraceRow.attempt_id == attempt_id)).all()
    rows = sorted(rows, key=lambda r: (order.get(r.workload_uuid, len(order)), r.workload_uuid))
    repeats = repeats or {}
    return [WorkloadResult(workload_uuid=r.workload_uuid, axes=axes.get(r.workload_uuid, {}), status=r.status,
                           t_sol_ms=r.t_sol_ms, t_baseline_ms=r.t_baseline_ms, sol_score=r.sol_score,
                           **_figures(r, repeats.get(r.workload_uuid, [])))
            for r in rows]


def _figures(row: TraceRow, repeats: list[tuple[Spread, Spread]]) -> dict[str, Any]:
    figures: dict[str, Any] = {"latency_ms": row.latency_ms, "reference_latency_ms": row.reference_latency_ms,
                               "speedup": row.speedup}
    own = _pair(row.trace_json)
    if own is None:
        return figures
    pairs = [own, *repeats]
    mine, reference = combine([p[0] for p in pairs]), combine([p[1] for p in pairs])
    if repeats:
        figures = {"latency_ms": mine.median_ms, "reference_latency_ms": reference.median_ms,
                   "speedup": reference.median_ms / mine.median_ms if mine.median_ms > 0 else None}
    return figures | {"latency_q1_ms": mine.q1_ms, "latency_q3_ms": mine.q3_ms, "reference_q1_ms": reference.q1_ms,
                      "reference_q3_ms": reference.q3_ms, "speedup_clear": not mine.overlaps(reference),
                      "attempts": len(pairs)}


def _pair(trace_json: str) -> tuple[Spread, Spread] | None:
    try:
        return spreads(Trace.model_validate_json(trace_json))
    except ValidationError:  # a row some tool wrote without a whole trace: its figures stand alone
        return None


def _repeats(session: Session, problem_id: int, best: AttemptSummary, workloads: int) -> Pairs:
    """The per-workload spreads of the best attempt's repeats: the other PASSED verdict attempts of its
    solution on the problem, on the same device and hardware (a profile or inspect run is no verdict),
    the latest REPEATS_LIMIT of them. One query, at most REPEATS_LIMIT rows a workload."""
    hardware = AttemptRow.hardware.is_(None) if best.hardware is None else AttemptRow.hardware == best.hardware
    repeated = (select(AttemptRow.id)
                .where(AttemptRow.problem_id == problem_id, AttemptRow.solution_hash == best.solution_hash,
                       AttemptRow.device == best.device, hardware, AttemptRow.status == PASSED,
                       AttemptRow.kind == VERDICT_KIND, AttemptRow.id != best.id)
                .order_by(AttemptRow.created_at.desc(), AttemptRow.id.desc()).limit(REPEATS_LIMIT).subquery())
    rows = session.execute(
        select(TraceRow.workload_uuid, TraceRow.trace_json).join(repeated, repeated.c.id == TraceRow.attempt_id)
        .where(TraceRow.status == PASSED).limit(REPEATS_LIMIT * max(workloads, 1))).all()
    pairs: Pairs = {}
    for row in rows:
        pair = _pair(row.trace_json)
        if pair is not None:
            pairs.setdefault(row.workload_uuid, []).append(pair)
    return pairs
